//! The drivers' errors and their one mapping to gRPC codes (CSI spec error
//! tables): handlers return [`DriverError`], the tonic glue converts. A
//! driver adds what only it knows (which OpenStack refusals mean what) in
//! its own `errors` module, by building the variant it means.

use openstack_client::Error as CloudError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
    #[error("{context}: {source}")]
    Cloud {
        context: String,
        source: Box<CloudError>,
    },
    #[error("{context}: {source}")]
    Host {
        context: String,
        source: Box<host_ops::HostError>,
    },
}

pub type DriverResult<T> = Result<T, DriverError>;

/// Adds what the driver was doing to a lower layer's error.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> DriverResult<T>;
}

impl<T> Context<T> for Result<T, CloudError> {
    fn context(self, what: impl Into<String>) -> DriverResult<T> {
        self.map_err(|source| DriverError::Cloud {
            context: what.into(),
            source: Box::new(source),
        })
    }
}

impl<T> Context<T> for Result<T, host_ops::HostError> {
    fn context(self, what: impl Into<String>) -> DriverResult<T> {
        self.map_err(|source| DriverError::Host {
            context: what.into(),
            source: Box::new(source),
        })
    }
}

/// The gRPC code an OpenStack error becomes when the driver knows nothing
/// more specific about it.
pub fn cloud_code(e: &CloudError) -> Code {
    match e {
        CloudError::NotFound(_) => Code::NotFound,
        // Cinder/Nova answer 400/409 for "not in the right state" (attached,
        // being detached, has dependent snapshots): a precondition, which
        // the sidecars retry
        CloudError::Conflict(_) | CloudError::BadRequest(_) => Code::FailedPrecondition,
        CloudError::Unauthorized(_) => Code::Unauthenticated,
        CloudError::Forbidden(_) => Code::PermissionDenied,
        CloudError::OverQuota(_) => Code::ResourceExhausted,
        CloudError::RateLimited { .. } | CloudError::Unavailable(_) | CloudError::Busy(_) => {
            Code::Unavailable
        }
        CloudError::Timeout { .. } | CloudError::StillPending { .. } => Code::DeadlineExceeded,
        CloudError::Config(_)
        | CloudError::Tls(_)
        | CloudError::EndpointNotFound { .. }
        | CloudError::Unsupported { .. } => Code::FailedPrecondition,
        CloudError::InvalidId { .. } => Code::InvalidArgument,
        CloudError::InvalidResponse { .. } | CloudError::ResourceFailed { .. } => Code::Internal,
    }
}

impl DriverError {
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Aborted(_) => Code::Aborted,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Internal(_) => Code::Internal,
            Self::Cloud { source, .. } => cloud_code(source.as_ref()),
            Self::Host { source, .. } => match source.as_ref() {
                host_ops::HostError::UnsupportedFilesystem(_) => Code::InvalidArgument,
                host_ops::HostError::Refused(_) => Code::InvalidArgument,
                host_ops::HostError::NotAMountPoint(_) => Code::FailedPrecondition,
                _ => Code::Internal,
            },
        }
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Self {
        let code = e.code();
        if matches!(
            code,
            Code::Internal | Code::Unavailable | Code::DeadlineExceeded
        ) {
            tracing::warn!(code = ?code, error = %e, "request failed");
        } else {
            tracing::info!(code = ?code, error = %e, "request refused");
        }
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openstack_client::ApiError;

    fn api(status: u16) -> ApiError {
        ApiError {
            operation: "volume_create",
            status: Some(status),
            request_id: None,
            message: "x".into(),
        }
    }

    #[test]
    fn quota_is_resource_exhausted_and_outages_are_retryable() {
        let e: Result<(), _> = Err(CloudError::OverQuota(api(413)));
        assert_eq!(
            e.context("creating").unwrap_err().code(),
            Code::ResourceExhausted
        );
        let e: Result<(), _> = Err(CloudError::Unavailable(api(503)));
        assert_eq!(e.context("creating").unwrap_err().code(), Code::Unavailable);
        let e: Result<(), _> = Err(CloudError::NotFound(api(404)));
        assert_eq!(e.context("getting").unwrap_err().code(), Code::NotFound);
    }
}

/// A delete's answer, with "not found" read as done.
pub fn not_found_ok(answer: Result<(), CloudError>) -> Result<(), CloudError> {
    match answer {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

/// The answer of a call that failed after it made `what` (a volume, a
/// share, a snapshot), once it tried to delete it (`cleanup`: the
/// delete's answer). The failure as it is when the delete went through.
/// Otherwise Unavailable, whatever the failure was: a final answer would
/// leave `what` for good (the provisioner forgets a CreateVolume whose
/// claim is deleted meanwhile, the snapshotter a CreateSnapshot), while
/// the caller's retry finds it by name and deletes it.
pub fn unless_left_behind(
    failure: DriverError,
    cleanup: Result<(), CloudError>,
    what: &str,
) -> DriverError {
    match not_found_ok(cleanup) {
        Ok(()) => failure,
        Err(e) => DriverError::Unavailable(format!(
            "{failure}; deleting {what} failed too, a retry deletes it: {e}"
        )),
    }
}

/// Deleting `what`, failed and left by an earlier attempt, before this
/// call tries anew: a refusal is answered Unavailable (the retry deletes
/// it), never with the refusal's final code, which would leave it.
pub fn remove_left(cleanup: Result<(), CloudError>, what: &str) -> DriverResult<()> {
    not_found_ok(cleanup).map_err(|e| {
        DriverError::Unavailable(format!(
            "{what}, failed in an earlier attempt, is left: deleting it failed, a retry deletes it: {e}"
        ))
    })
}

/// What an OpenStack delete call answered, as both drivers read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The service took the request (it deletes asynchronously).
    Accepted,
    /// It was gone already.
    Gone,
}

/// Maps a delete call's answer: a 404 means gone, a 400/409 is a state
/// the user resolves (FailedPrecondition naming `service` and `what`),
/// anything else keeps its own code.
pub fn deletion(
    answer: Result<(), CloudError>,
    service: &str,
    what: &str,
) -> DriverResult<Deletion> {
    match answer {
        Ok(()) => Ok(Deletion::Accepted),
        Err(e) if e.is_not_found() => Ok(Deletion::Gone),
        Err(CloudError::BadRequest(e)) | Err(CloudError::Conflict(e)) => {
            Err(DriverError::FailedPrecondition(format!(
                "{service} refuses to delete {what}: {}",
                e.message
            )))
        }
        Err(e) => Err(e).context(format!("deleting {what}")),
    }
}

/// Maps a create call's answer: a 400 is a state the user resolves
/// (FailedPrecondition, `refusal` saying what was refused); anything else
/// keeps its own code, with `what` as context.
pub fn created<T>(
    answer: Result<T, CloudError>,
    service: &str,
    refusal: &str,
    what: &str,
) -> DriverResult<T> {
    match answer {
        Ok(t) => Ok(t),
        Err(CloudError::BadRequest(e)) => Err(DriverError::FailedPrecondition(format!(
            "{service} refuses {refusal}: {}",
            e.message
        ))),
        Err(e) => Err(e).context(what.to_string()),
    }
}

/// The one resource an earlier call made under `name`, if any: several
/// is an Internal error naming them (which one is ours is for a person
/// to decide).
pub fn at_most_one<T>(
    found: Vec<T>,
    kind: &str,
    name: &str,
    id: impl Fn(&T) -> &str,
) -> DriverResult<Option<T>> {
    if found.len() > 1 {
        let ids: Vec<&str> = found.iter().map(&id).collect();
        return Err(DriverError::Internal(format!(
            "several {kind} are named {name}: {ids:?}; delete the extra ones"
        )));
    }
    Ok(found.into_iter().next())
}
