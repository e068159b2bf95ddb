//! A plugin killed between two cloud calls: the emulator serves the k-th
//! call of the services (logins aside) and holds its answer, so that the
//! work is done and the plugin, killed meanwhile, never learns it.

use std::future::Future;
use std::time::{Duration, Instant};

use openstack_emulator::{Emulator, FaultAction, FaultRule};

/// The service calls (logins aside) the emulator has answered so far.
pub fn service_calls(emulator: &Emulator) -> usize {
    emulator
        .control()
        .calls()
        .iter()
        .filter(|c| !c.path.starts_with("/identity"))
        .count()
}

/// Runs `rpc` with the `k`-th service call from now served and its answer
/// held. None once that call has been served (the caller then kills the
/// plugin, whose RPC is left without its answer); the RPC's own result
/// when it ended first (it made fewer calls this time).
pub async fn until_kth_call_served<T>(
    emulator: &Emulator,
    k: usize,
    rpc: impl Future<Output = T>,
) -> Option<T> {
    let before = service_calls(emulator);
    emulator.control().add_fault(
        FaultRule::new(None, "/", FaultAction::HoldAnswer { millis: 3000 })
            .except("/identity")
            .every_nth(u32::try_from(k).unwrap_or(u32::MAX))
            .times(1),
    );
    tokio::pin!(rpc);
    let started = Instant::now();
    let outcome = loop {
        tokio::select! {
            r = &mut rpc => break Some(r),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                if service_calls(emulator) >= before + k {
                    break None;
                }
                if started.elapsed() > Duration::from_secs(60) {
                    break None;
                }
            }
        }
    };
    emulator.control().clear_faults();
    outcome
}

/// What a crash test drives: one RPC of a plugin on the emulator, a fresh
/// target for each run, what one fault-free call leaves, and the plugin
/// killed and started again.
pub trait Subject {
    type Target;
    fn emulator(&self) -> std::sync::Arc<Emulator>;
    /// A fresh target for one run (`run` names it).
    fn prepare(&mut self, run: &str) -> impl Future<Output = Self::Target>;
    /// The RPC, once.
    fn call(&self, target: &Self::Target) -> impl Future<Output = Result<(), tonic::Status>>;
    /// Ok when the cloud holds what one fault-free call leaves, else what
    /// differs.
    fn left_as_one_call_leaves(
        &self,
        target: &Self::Target,
    ) -> impl Future<Output = Result<(), String>>;
    /// The plugin killed (SIGKILL) and started again, ready.
    fn restart(&mut self) -> impl Future<Output = ()>;
}

/// The RPC sent again, as a sidecar does after an error, until it answers
/// OK (panics after 90 s, naming the answers).
pub async fn until_ok<S: Subject>(s: &S, target: &S::Target) {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        match s.call(target).await {
            Ok(()) => return,
            Err(status) => seen.push(format!("{:?}: {}", status.code(), status.message())),
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "never OK: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What [`killed_after_each_call`] did.
#[derive(Debug, Default)]
pub struct Crashes {
    /// The cloud calls of one fault-free call.
    pub calls: usize,
    /// Runs in which the plugin was killed (the RPC ended first in the
    /// others).
    pub kills: usize,
    /// Runs that left something else than one call leaves.
    pub broken: Vec<String>,
}

/// The RPC once fault-free (counting its cloud calls), then once for each
/// k of them: killed after its k-th call, started again, the RPC sent
/// again until OK, and what the cloud holds compared with one call's.
pub async fn killed_after_each_call<S: Subject>(s: &mut S) -> Crashes {
    let emulator = s.emulator();
    let t = s.prepare("fault-free").await;
    let before = service_calls(&emulator);
    until_ok(s, &t).await;
    let mut out = Crashes {
        calls: service_calls(&emulator) - before,
        ..Default::default()
    };
    if let Err(why) = s.left_as_one_call_leaves(&t).await {
        out.broken.push(format!("fault-free: {why}"));
    }
    for k in 1..=out.calls {
        let t = s.prepare(&format!("killed-after-{k}")).await;
        let first = until_kth_call_served(&emulator, k, s.call(&t)).await;
        if first.is_none() {
            out.kills += 1;
            s.restart().await;
        }
        until_ok(s, &t).await;
        if let Err(why) = s.left_as_one_call_leaves(&t).await {
            out.broken
                .push(format!("killed after call {k} of {}: {why}", out.calls));
        }
    }
    out
}
