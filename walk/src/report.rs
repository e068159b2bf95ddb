//! What the walk prints: one line per step with its duration and what it
//! found, a line every few seconds while a long step runs, and a summary
//! table at the end.

use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::StepFailure;

/// How often a step that is still running says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

#[derive(Debug, Clone)]
struct Row {
    part: &'static str,
    outcome: Outcome,
    took: Duration,
}

/// The walk's report, written to stdout as it goes.
#[derive(Debug)]
pub struct Report {
    part: &'static str,
    rows: Vec<Row>,
    started: Instant,
}

impl Default for Report {
    fn default() -> Self {
        Self::new()
    }
}

impl Report {
    pub fn new() -> Self {
        Self {
            part: "",
            rows: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Starts a part (`volume`, `share`, `secrets`, ...) with a headline
    /// saying what it drives.
    pub fn part(&mut self, part: &'static str, headline: &str) {
        self.part = part;
        say(&format!("\n-- {part}: {headline}"));
    }

    /// Prints a line of context (not a step).
    pub fn note(&self, text: &str) {
        say(&format!("        {text}"));
    }

    /// Runs one step: prints its outcome, duration and detail, and a
    /// progress line every two seconds while it runs. The step's value, or
    /// None when it failed.
    pub async fn step<T, F>(&mut self, name: &str, step: F) -> Option<T>
    where
        F: Future<Output = Result<(T, String), StepFailure>>,
    {
        let started = Instant::now();
        tokio::pin!(step);
        let result = loop {
            tokio::select! {
                r = &mut step => break r,
                _ = tokio::time::sleep_until((started + PROGRESS_EVERY * self.ticks(started)).into()) => {
                    say(&format!("  ...   {name}: still running ({} s)", started.elapsed().as_secs()));
                }
            }
        };
        let took = started.elapsed();
        match result {
            Ok((value, detail)) => {
                say(&format!("  ok    {name:<42} {:>7}  {detail}", human(took)));
                self.rows.push(Row {
                    part: self.part,
                    outcome: Outcome::Passed,
                    took,
                });
                Some(value)
            }
            Err(e) => {
                let why = e.to_string();
                say(&format!("  FAIL  {name:<42} {:>7}  {why}", human(took)));
                for hint in e.hints() {
                    say(&format!("        check: {hint}"));
                }
                self.rows.push(Row {
                    part: self.part,
                    outcome: Outcome::Failed(why),
                    took,
                });
                None
            }
        }
    }

    /// Records a step that does not run, and why.
    pub fn skip(&mut self, name: &str, why: &str) {
        say(&format!("  skip  {name:<42} {:>7}  {why}", "-"));
        self.rows.push(Row {
            part: self.part,
            outcome: Outcome::Skipped(why.to_string()),
            took: Duration::ZERO,
        });
    }

    /// Ticks of [`PROGRESS_EVERY`] until the next progress line.
    fn ticks(&self, started: Instant) -> u32 {
        let done = started.elapsed().as_millis() / PROGRESS_EVERY.as_millis().max(1);
        u32::try_from(done).unwrap_or(u32::MAX).saturating_add(1)
    }

    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Failed(_)))
    }

    pub fn passed(&self) -> usize {
        self.count(|o| *o == Outcome::Passed)
    }

    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skipped(_)))
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.rows.iter().filter(|r| f(&r.outcome)).count()
    }

    /// The summary table: per part, its steps and time.
    pub fn summary(&self) {
        say("\n-- summary");
        say(&format!(
            "  {:<10} {:>5} {:>5} {:>8} {:>7} {:>9}",
            "part", "steps", "ok", "skipped", "failed", "time"
        ));
        let mut parts: Vec<&'static str> = Vec::new();
        for r in &self.rows {
            if !parts.contains(&r.part) {
                parts.push(r.part);
            }
        }
        for part in parts {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.part == part).collect();
            let n = |f: &dyn Fn(&Outcome) -> bool| rows.iter().filter(|r| f(&r.outcome)).count();
            say(&format!(
                "  {:<10} {:>5} {:>5} {:>8} {:>7} {:>9}",
                part,
                rows.len(),
                n(&|o| *o == Outcome::Passed),
                n(&|o| matches!(o, Outcome::Skipped(_))),
                n(&|o| matches!(o, Outcome::Failed(_))),
                human(rows.iter().map(|r| r.took).sum()),
            ));
        }
        say(&format!(
            "  {:<10} {:>5} {:>5} {:>8} {:>7} {:>9}",
            "all",
            self.rows.len(),
            self.passed(),
            self.skipped(),
            self.failed(),
            human(self.started.elapsed()),
        ));
        let mut reasons: Vec<&str> = Vec::new();
        for r in &self.rows {
            if let Outcome::Skipped(why) = &r.outcome
                && !reasons.contains(&why.as_str())
            {
                reasons.push(why);
            }
        }
        for why in reasons {
            say(&format!("  skipped: {why}"));
        }
    }
}

/// `412 ms`, `3.2 s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Bytes as MiB or GiB.
pub fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// One line on stdout, flushed (the walk is read as it runs).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
