//! Log set-up shared by the binaries: text or JSON, level by flag or
//! `RUST_LOG`.

use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format must be text or json, not {other:?}")),
        }
    }
}

/// Log flags every binary takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log level or filter (e.g. `info`, `debug,hyper=info`); `RUST_LOG`
    /// is used when this is not given.
    #[arg(long, env = "LOG_LEVEL")]
    pub log_level: Option<String>,
    /// klog's verbosity, as upstream's plugins take it (`-v=2`, `--v=4`,
    /// which their charts and manifests pass): 0 to 3 `info`, 4 and 5
    /// `debug`, 6 and more `trace`. `--log-level` and `RUST_LOG` win.
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u8>,
}

impl LogArgs {
    /// The filter these flags ask for, `RUST_LOG` when they ask none.
    pub fn filter(&self) -> String {
        let klog = self.verbosity.map(|v| match v {
            0..=3 => "info",
            4..=5 => "debug",
            _ => "trace",
        });
        self.log_level
            .clone()
            .or_else(|| std::env::var("RUST_LOG").ok())
            .or_else(|| klog.map(str::to_string))
            .unwrap_or_else(|| "info".to_string())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?}: {message}")]
pub struct LogError {
    filter: String,
    message: String,
}

/// Installs the global subscriber (logs go to stderr).
pub fn init(args: &LogArgs) -> Result<(), LogError> {
    let filter_text = args.filter();
    let filter = tracing_subscriber::EnvFilter::try_new(&filter_text).map_err(|e| LogError {
        filter: filter_text.clone(),
        message: e.to_string(),
    })?;
    // colour only for a person at a terminal: a file, a journal or
    // `kubectl logs` gets plain text, and JSON never carries escapes
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Json => builder
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.with_ansi(terminal).try_init(),
    };
    // a second init (tests) keeps the first subscriber
    let _ = result;
    Ok(())
}

/// The longest request field a log line carries.
pub const MAX_LOGGED_FIELD: usize = 128;

/// A field a caller wrote, as a log line may carry it: control characters
/// escaped (a newline cannot forge a line) and cut to
/// [`MAX_LOGGED_FIELD`] characters, with the full length said.
pub fn caller_field(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars().take(MAX_LOGGED_FIELD) {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    let n = value.chars().count();
    if n > MAX_LOGGED_FIELD {
        out.push_str(&format!("...({n} characters)"));
    }
    out
}

#[cfg(test)]
mod caller_field_tests {
    use super::*;

    #[test]
    fn escapes_and_bounds() {
        assert_eq!(caller_field("pod-1"), "pod-1");
        assert_eq!(caller_field("a\nb\r\x1b"), "a\\nb\\r\\u{1b}");
        let long = caller_field(&"x".repeat(120_000));
        assert!(
            long.len() < 200 && long.ends_with("(120000 characters)"),
            "{long}"
        );
    }
}
