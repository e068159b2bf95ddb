//! The campaign's plan and what its seed draws: the same seed, the same
//! campaign (every step's faults, operation and writer drawn before the
//! first step).

use std::time::Duration;

use super::{FaultClass, Operation, WRITERS};

/// A small, seedable generator (splitmix64): the same seed, the same
/// campaign.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.draw() % n.max(1) as u64) as usize
    }

    /// `items` in an order of the seed's.
    pub fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut v = items.to_vec();
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
        v
    }
}

/// The campaign's parameters.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Steps; each injects `faults_per_step` faults of distinct classes
    /// at once.
    pub steps: usize,
    pub faults_per_step: usize,
    /// How long each fault lasts.
    pub window: Duration,
    /// The bound within which everything must have converged after a
    /// step's faults ended.
    pub converge_bound: Duration,
    /// How long a node stays cut off (the node cuts end at least this
    /// long after they began, past the window if need be).
    pub cut: Duration,
    /// No step begins past this time from the campaign's start (a long
    /// campaign that must fit a slot ends early, and says how far it got).
    pub stop_after: Option<Duration>,
}

/// What the seed drew for one step: its faults (a whole cluster's
/// restart first), its operation and the writer it picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDraw {
    pub faults: Vec<FaultClass>,
    pub operation: Operation,
    pub pick: usize,
}

impl Plan {
    /// Every step's draw, from the seed alone: every class once before
    /// any twice, no class twice in a step, and an attaching operation
    /// where Nova is busy (a busy Nova is felt only by an attach).
    pub fn draw(&self) -> Vec<StepDraw> {
        let mut rng = Rng::new(self.seed);
        let mut deck: Vec<FaultClass> = Vec::new();
        (0..self.steps)
            .map(|_| {
                let mut faults = Vec::new();
                while faults.len() < self.faults_per_step.min(FaultClass::ALL.len()) {
                    if deck.is_empty() {
                        deck = rng.shuffled(&FaultClass::ALL);
                    }
                    let f = deck.remove(0);
                    if !faults.contains(&f) {
                        faults.push(f);
                    } else {
                        deck.push(f);
                    }
                }
                // a whole cluster's restart first: it starts every
                // kubelet, a stopped one too, and is over before the
                // operation begins
                faults.sort_by_key(|f| *f != FaultClass::ClusterRestarted);
                let mut operation = Operation::ALL[rng.below(Operation::ALL.len())];
                if faults.contains(&FaultClass::NovaBusy) && !operation.attaches() {
                    let attaching: Vec<Operation> = Operation::ALL
                        .into_iter()
                        .filter(|o| o.attaches())
                        .collect();
                    operation = attaching[rng.below(attaching.len())];
                }
                let pick = rng.below(WRITERS);
                StepDraw {
                    faults,
                    operation,
                    pick,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn plan(seed: u64, steps: usize) -> Plan {
        Plan {
            seed,
            steps,
            faults_per_step: 5,
            window: Duration::from_secs(10),
            converge_bound: Duration::from_secs(300),
            cut: Duration::from_secs(10),
            stop_after: None,
        }
    }

    #[test]
    fn the_seed_alone_draws_every_class_once_first_and_an_attach_for_a_busy_nova() {
        for seed in 0..200 {
            let quick = plan(seed, FaultClass::ALL.len().div_ceil(5)).draw();
            assert_eq!(quick, plan(seed, quick.len()).draw(), "seed {seed} replays");
            let drawn: BTreeSet<FaultClass> = quick
                .iter()
                .flat_map(|d| d.faults.iter().copied())
                .collect();
            assert_eq!(
                drawn.len(),
                FaultClass::ALL.len(),
                "seed {seed}: every class once"
            );
            for d in plan(seed, 12).draw() {
                let distinct: BTreeSet<_> = d.faults.iter().collect();
                assert_eq!(
                    distinct.len(),
                    d.faults.len(),
                    "seed {seed}: a class twice in {d:?}"
                );
                assert!(d.pick < WRITERS);
                if d.faults.contains(&FaultClass::NovaBusy) {
                    assert!(d.operation.attaches(), "seed {seed}: {d:?}");
                }
                if let Some(i) = d
                    .faults
                    .iter()
                    .position(|f| *f == FaultClass::ClusterRestarted)
                {
                    assert_eq!(i, 0, "seed {seed}: the cluster's restart first in {d:?}");
                }
            }
        }
    }
}
