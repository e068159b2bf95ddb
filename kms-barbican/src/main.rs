use clap::Parser;
use kms_barbican::options::Options;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse_from(plugin_runtime::upstream_args::without_program_path(
        std::env::args_os(),
        "barbican-kms-plugin",
    ));
    plugin_runtime::logging::init(&opts.log)?;
    kms_barbican::plugin::run(opts).await?;
    Ok(())
}
