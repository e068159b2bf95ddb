//! The driver's errors: the shared [`DriverError`] and its one mapping to
//! gRPC codes, plus what Manila's user messages mean when a share or a
//! snapshot ends in `error`.

pub use csi_common::errors::{Context, DriverError, DriverResult};
use openstack_client::manila::UserMessage;

/// The error for a resource Manila failed, from its newest user message
/// (`detail_id` as Manila's `message_field` defines them): no backend
/// with room is ResourceExhausted, a request no backend can serve (share
/// network, capabilities) is InvalidArgument, anything else Internal.
pub fn failure_from_messages(what: &str, messages: &[UserMessage]) -> DriverError {
    let Some(m) = messages.first() else {
        return DriverError::Internal(format!(
            "{what} failed in Manila, which left no user message saying why"
        ));
    };
    let text = format!("{what} failed in Manila: {}", m.user_message);
    match m.detail_id.as_deref() {
        // no valid host, availability zone filter, capacity filter
        Some("002") | Some("007") | Some("009") => DriverError::ResourceExhausted(text),
        // unexpected network, capabilities filter
        Some("003") | Some("008") => DriverError::InvalidArgument(text),
        // older Manila merges capacity into "No storage could be allocated"
        _ if m.user_message.contains("Capacity filter") => DriverError::ResourceExhausted(text),
        _ => DriverError::Internal(text),
    }
}

/// Whether a failed share may succeed when created again: the scheduler
/// found no valid host or no backend with the type's capabilities, which
/// is also what it answers while a backend's periodic capability report is
/// missing (the CephFS driver skips one while a clone is pending).
pub fn scheduling_may_pass_later(messages: &[UserMessage]) -> bool {
    messages
        .first()
        .is_some_and(|m| matches!(m.detail_id.as_deref(), Some("002") | Some("008")))
}

/// The answer when the scheduler refused a share again after the pause
/// (see [`scheduling_may_pass_later`]): FailedPrecondition, a final answer
/// (nothing is left in Manila: the failed shares are deleted) that the
/// provisioner retries with its usual backoff while the claim exists.
/// Not InvalidArgument: the external-provisioner (v6) takes that as
/// infeasible and leaves the claim alone for five minutes, which a burst of
/// 100 CephFS claims on the test cloud showed (Manila's scheduler missed a
/// backend's report for every share created in the same few seconds, and
/// one claim was Bound after 342 s instead of 44). Not a retryable code
/// either: a share type no backend serves would then be created and
/// deleted again and again even after its claim is gone.
pub fn scheduling_refused_again(refusal: DriverError) -> DriverError {
    DriverError::FailedPrecondition(format!(
        "{refusal} (twice, a few seconds apart: no backend has the share type's capabilities, or one's periodic report is late)"
    ))
}

/// The answer when the scheduler refused a share once and the caller's
/// deadline leaves no time to create it again: FailedPrecondition, as
/// after a second refusal (see [`scheduling_refused_again`]); the next
/// call tries again.
pub fn scheduling_refused_without_time(refusal: DriverError) -> DriverError {
    DriverError::FailedPrecondition(format!(
        "{refusal} (once; too little of the call's deadline was left to create it again: the next call does)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(detail: &str, text: &str) -> UserMessage {
        UserMessage {
            id: "m".into(),
            resource_id: Some("s".into()),
            action_id: Some("001".into()),
            detail_id: Some(detail.into()),
            user_message: text.into(),
            message_level: Some("ERROR".into()),
            created_at: None,
        }
    }

    #[test]
    fn user_messages_choose_the_code() {
        use tonic::Code;
        let c = |d: &str, t: &str| failure_from_messages("share x", &[msg(d, t)]).code();
        assert_eq!(c("009", "capacity"), Code::ResourceExhausted);
        assert_eq!(
            c("008", "Capacity filter didn't succeed"),
            Code::InvalidArgument
        );
        assert_eq!(
            c("001", "allocate host: ... Capacity filter didn't succeed"),
            Code::ResourceExhausted
        );
        assert_eq!(c("001", "driver failed"), Code::Internal);
        assert_eq!(failure_from_messages("x", &[]).code(), Code::Internal);
        let text = failure_from_messages("share x", &[msg("009", "No storage")]).to_string();
        assert!(text.contains("No storage"), "{text}");
    }
}
