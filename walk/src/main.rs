//! `suite-walk`: the suite's main job (see the library).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let options = suite_walk::Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let failed = runtime.block_on(suite_walk::run(options))?;
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
