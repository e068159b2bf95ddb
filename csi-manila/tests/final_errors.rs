//! A final error leaves nothing behind (see csi-cinder's final_errors.rs
//! for why): a CreateVolume driven as the provisioner drives it (the same
//! request again after a retryable answer) until a final answer leaves no
//! share of its name, also when Manila refuses the first deletion of the
//! share that failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use tonic::Code;

mod common;
use common::*;

#[tokio::test]
async fn a_create_answered_with_a_final_error_leaves_no_share() {
    let e = env("NFS").await;
    e.h.emulator.control().fail_next_share_creates(50);
    for (name, refuse_first_delete) in [("always-fails", false), ("fails-and-stays", true)] {
        if refuse_first_delete {
            e.h.emulator.control().add_fault(
                FaultRule::new(
                    Some("DELETE"),
                    "/shares/",
                    FaultAction::Status {
                        status: 400,
                        message: Some(
                            "Invalid share: share status must be one of available, error".into(),
                        ),
                        retry_after: None,
                        hint: RetryHint::None,
                    },
                )
                .times(1),
            );
        }
        let r = e.create_req(name, 1, &[("nfs-shareClient", "10.0.0.0/8")]);
        let mut answer = None;
        for _ in 0..20 {
            match e.c.clone().create_volume(r.clone()).await {
                Ok(_) => panic!("{name}: answered OK, the case expects a final error"),
                Err(s)
                    if matches!(
                        s.code(),
                        Code::Cancelled
                            | Code::DeadlineExceeded
                            | Code::Unavailable
                            | Code::ResourceExhausted
                            | Code::Aborted
                    ) =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => {
                    answer = Some(s);
                    break;
                }
            }
        }
        let s = answer.unwrap_or_else(|| panic!("{name}: still retryable after 20 calls"));
        let mut left = Vec::new();
        for _ in 0..100 {
            left = e
                .manila
                .list_shares_named(name)
                .await
                .unwrap()
                .into_iter()
                .map(|s| format!("{} {}", s.id, s.status))
                .collect();
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            left.is_empty(),
            "CreateVolume {name} answered {:?} ({}), and left {left:?}",
            s.code(),
            s.message()
        );
    }
}
