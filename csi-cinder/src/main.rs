use clap::Parser;
use csi_cinder::Options;

#[tokio::main]
#[allow(clippy::print_stdout)]
async fn main() -> anyhow::Result<()> {
    if csi_common::pre_stop::invoked() {
        csi_common::pre_stop::main(csi_cinder::DEFAULT_DRIVER_NAME).await?;
        return Ok(());
    }
    if csi_common::orphans::invoked() {
        let printed = csi_cinder::orphans::main().await?;
        print!("{}", printed.text);
        if let Some(failure) = printed.failure {
            anyhow::bail!(failure);
        }
        return Ok(());
    }
    let opts = Options::parse_from(plugin_runtime::upstream_args::without_program_path(
        std::env::args_os(),
        "cinder-csi-plugin",
    ));
    plugin_runtime::logging::init(&opts.log)?;
    csi_cinder::plugin::run(opts).await?;
    Ok(())
}
