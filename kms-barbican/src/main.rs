use clap::Parser;
use kms_barbican::options::Options;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    kms_barbican::plugin::run(opts).await?;
    Ok(())
}
