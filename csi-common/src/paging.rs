//! ListVolumes/ListSnapshots paging: the caller's `max_entries` and the
//! tokens this driver hands out. A token the driver did not issue is
//! `Aborted` (the CSI spec's code for an invalid `starting_token`).

use crate::errors::{DriverError, DriverResult};
use crate::request::is_uuid;

/// Entries per page when the caller sets no limit: a page at a time keeps
/// every call short on big projects.
pub const DEFAULT_PAGE: u32 = 500;

/// Entries per page: `max_entries`, or [`DEFAULT_PAGE`] when the caller
/// sets no limit (0).
pub fn page_limit(max_entries: i32) -> DriverResult<u32> {
    match max_entries {
        n if n < 0 => Err(DriverError::InvalidArgument(
            "max_entries must not be negative".into(),
        )),
        0 => Ok(DEFAULT_PAGE),
        n => Ok(n as u32),
    }
}

fn foreign(token: &str) -> DriverError {
    DriverError::Aborted(format!(
        "starting_token {token:?} is not one this driver issued"
    ))
}

/// A marker token (the id of the last entry returned, as Cinder pages).
pub fn marker_from_token(token: &str) -> DriverResult<Option<String>> {
    match token {
        "" => Ok(None),
        t if is_uuid(t) => Ok(Some(t.to_string())),
        t => Err(foreign(t)),
    }
}

const OFFSET_PREFIX: &str = "offset:";

/// An offset token (how many entries came before, as Manila pages).
pub fn offset_token(offset: u64) -> String {
    format!("{OFFSET_PREFIX}{offset}")
}

pub fn offset_from_token(token: &str) -> DriverResult<u64> {
    if token.is_empty() {
        return Ok(0);
    }
    token
        .strip_prefix(OFFSET_PREFIX)
        .filter(|d| !d.is_empty() && d.len() <= 19 && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| foreign(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_tokens() {
        assert_eq!(page_limit(0).unwrap(), DEFAULT_PAGE);
        assert_eq!(page_limit(7).unwrap(), 7);
        assert!(matches!(
            page_limit(-1),
            Err(DriverError::InvalidArgument(_))
        ));
        assert_eq!(offset_from_token("").unwrap(), 0);
        assert_eq!(offset_from_token(&offset_token(42)).unwrap(), 42);
        for bad in ["42", "offset:", "offset:-1", "offset:1x", "no-such-token"] {
            assert!(
                matches!(offset_from_token(bad), Err(DriverError::Aborted(_))),
                "{bad}"
            );
        }
        assert_eq!(marker_from_token("").unwrap(), None);
        assert!(matches!(
            marker_from_token("x"),
            Err(DriverError::Aborted(_))
        ));
    }
}
