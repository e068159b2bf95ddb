//! What a campaign did, and the table the test and the bench print.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{FaultClass, Operation, PRESSURE_FACTOR, StepRecord, pressure_bound};

/// What a campaign did.
#[derive(Debug, Default)]
pub struct Report {
    /// Each operation's Cinder and Nova calls without faults.
    pub baseline: BTreeMap<Operation, usize>,
    pub steps: Vec<StepRecord>,
    pub violations: Vec<String>,
    pub orphans_found: usize,
    /// Samples of the nodes' mounts taken and failed; of the cloud's
    /// records taken and failed (an outage keeps them from being read).
    pub node_samples: (usize, usize),
    pub cloud_samples: (usize, usize),
}

impl Report {
    pub fn faults_by_class(&self) -> BTreeMap<FaultClass, usize> {
        let mut m = BTreeMap::new();
        for s in &self.steps {
            for f in &s.faults {
                *m.entry(*f).or_default() += 1;
            }
        }
        m
    }

    /// p50 and max of the convergence times of the steps a class was in.
    pub fn convergence(&self, class: FaultClass) -> Option<(Duration, Duration)> {
        let mut t: Vec<Duration> = self
            .steps
            .iter()
            .filter(|s| s.faults.contains(&class))
            .map(|s| s.converged_in)
            .collect();
        t.sort();
        // the lower median of an even count
        Some((*t.get(t.len().saturating_sub(1) / 2)?, *t.last()?))
    }

    /// The report as the bench and the test print it.
    pub fn table(&self, seed: u64) -> String {
        let mut s = format!(
            "campaign seed {seed}: {} steps, {} faults, {} invariant violations, {} orphans; samples of the nodes {} ({} failed), of the cloud's records {} ({} failed); writes acknowledged and verified {}\n",
            self.steps.len(),
            self.faults_by_class().values().sum::<usize>(),
            self.violations.len(),
            self.orphans_found,
            self.node_samples.0,
            self.node_samples.1,
            self.cloud_samples.0,
            self.cloud_samples.1,
            self.steps.last().map_or(0, |s| s.acknowledged)
        );
        s.push_str("| fault | injected | proven: served at the proxy, pods gone, probes refused (steps proven) | converged p50 | max |\n| --- | --- | --- | --- | --- |\n");
        for (class, n) in self.faults_by_class() {
            let (p50, max) = self.convergence(class).unwrap_or_default();
            let served = {
                let counts: Vec<u64> = self
                    .steps
                    .iter()
                    .filter_map(|st| st.served.get(&class).copied())
                    .collect();
                format!(
                    "{} ({} of {})",
                    counts.iter().sum::<u64>(),
                    counts.iter().filter(|c| **c > 0).count(),
                    counts.len()
                )
            };
            s.push_str(&format!(
                "| {class:?} | {n} | {served} | {:.1} s | {:.1} s |\n",
                p50.as_secs_f64(),
                max.as_secs_f64()
            ));
        }
        let mut by_service: BTreeMap<&str, usize> = BTreeMap::new();
        for st in &self.steps {
            for (service, n) in &st.calls_by_service {
                *by_service.entry(service).or_default() += n;
            }
        }
        let calls: usize = by_service.values().sum();
        s.push_str(&format!(
            "calls to the cloud: {calls} for {} operations ({:.1} per operation; by service {by_service:?})\n",
            self.steps.len(),
            calls as f64 / self.steps.len().max(1) as f64
        ));
        s.push_str(&format!("| operation | calls without faults | mean with the cloud throttled (steps) | mean with any faults (steps) | bound ({PRESSURE_FACTOR} times, and one a second) |\n| --- | --- | --- | --- | --- |\n"));
        for (op, base) in &self.baseline {
            let mean = |throttled: bool| {
                let v: Vec<usize> = self
                    .steps
                    .iter()
                    .filter(|s| {
                        s.operation == *op
                            && (!throttled || s.faults.contains(&FaultClass::CloudThrottled))
                    })
                    .map(|s| s.cloud_calls)
                    .collect();
                if v.is_empty() {
                    "-".to_string()
                } else {
                    format!(
                        "{:.1} ({})",
                        v.iter().sum::<usize>() as f64 / v.len() as f64,
                        v.len()
                    )
                }
            };
            s.push_str(&format!(
                "| {op:?} | {base} | {} | {} | {} + the step's seconds |\n",
                mean(true),
                mean(false),
                pressure_bound(&self.baseline, *op, 0)
            ));
        }
        for v in &self.violations {
            s.push_str(&format!("VIOLATION {v}\n"));
        }
        s
    }
}
