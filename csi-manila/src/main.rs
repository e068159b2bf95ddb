use clap::Parser;
use csi_manila::Options;

#[tokio::main]
#[allow(clippy::print_stdout)]
async fn main() -> anyhow::Result<()> {
    if csi_common::pre_stop::invoked() {
        csi_common::pre_stop::main(csi_manila::DEFAULT_DRIVER_NAME).await?;
        return Ok(());
    }
    if csi_manila::mount_pod_hook::invoked() {
        csi_manila::mount_pod_hook::main().await?;
        return Ok(());
    }
    if csi_common::orphans::invoked() {
        let printed = csi_manila::orphans::main().await?;
        print!("{}", printed.text);
        if let Some(failure) = printed.failure {
            anyhow::bail!(failure);
        }
        return Ok(());
    }
    let opts = Options::parse_from(plugin_runtime::upstream_args::without_program_path(
        std::env::args_os(),
        "manila-csi-plugin",
    ));
    plugin_runtime::logging::init(&opts.log)?;
    csi_manila::plugin::run(opts).await?;
    Ok(())
}
