use clap::Parser;
use csi_manila::Options;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    csi_manila::plugin::run(opts).await?;
    Ok(())
}
