//! A controller's Prometheus metrics on the host network, read as the
//! benches and tests need them.

/// The time a controller spent in these CSI Controller RPCs so far
/// (seconds, summed), from its gRPC metrics on the host network.
pub async fn controller_rpc_seconds(port: u16, methods: &[&str]) -> f64 {
    let text = controller_metrics(port).await;
    methods
        .iter()
        .map(|m| {
            metric_value(
                &text,
                &format!("grpc_server_handling_seconds_sum{{method=\"/csi.v1.Controller/{m}\"}}"),
            )
        })
        .sum()
}

/// The value of one series (its name and labels as `/metrics` writes
/// them) in a Prometheus text page; 0 where the page has none.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A controller's metrics on the host network, as text (empty when it
/// does not answer).
pub async fn controller_metrics(port: u16) -> String {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .await;
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
