use clap::Parser;
use csi_cinder::Options;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    csi_cinder::plugin::run(opts).await?;
    Ok(())
}
