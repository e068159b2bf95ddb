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
