//! Request plumbing every CSI handler needs: the caller's deadline,
//! required fields, sizes, capabilities and timestamps.

use std::time::{Duration, Instant};

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::metadata::MetadataMap;

use crate::errors::{DriverError, DriverResult};

pub const GIB: i64 = 1 << 30;
/// 1 PiB: far beyond any Cinder or Manila backend; a larger request is a
/// mistake (or an overflow), refused before it reaches OpenStack.
pub const MAX_VOLUME_GIB: i64 = 1 << 20;

/// Without a `grpc-timeout` from the caller, work stops after this long
/// (the sidecars send one; their default is 3 minutes, upstream's chart
/// too).
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(120);

/// A caller's `grpc-timeout` is honoured up to this: no CSI call of ours
/// needs longer, and a larger one (up to 99999999 hours in the header)
/// would hold locks and sessions for ever, or overflow an `Instant`.
pub const MAX_RPC_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What is kept of a caller's deadline for the reply: a twentieth of it,
/// at least this (a loaded node's scheduling took more than 50 ms between
/// the plugin's own deadline and its answer in a full test run, and the
/// caller then saw only its own timeout) ...
const MIN_REPLY_MARGIN: Duration = Duration::from_millis(200);
/// ... and at most this.
const MAX_REPLY_MARGIN: Duration = Duration::from_secs(2);

/// When the caller's deadline passes, its answer is lost; so stop a little
/// earlier and say why, leaving room for the reply.
pub fn deadline_from(metadata: &MetadataMap) -> Instant {
    let timeout = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .unwrap_or(DEFAULT_RPC_TIMEOUT)
        .min(MAX_RPC_TIMEOUT);
    let margin = (timeout / 20).clamp(MIN_REPLY_MARGIN, MAX_REPLY_MARGIN);
    Instant::now() + timeout.saturating_sub(margin)
}

/// `grpc-timeout` is up to 8 digits and a unit (H M S m u n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pub fn require<'a>(value: &'a str, what: &str) -> DriverResult<&'a str> {
    if value.is_empty() {
        Err(DriverError::InvalidArgument(format!("{what} is required")))
    } else {
        Ok(value)
    }
}

/// Cinder, Nova and Manila ids are UUIDs; anything else cannot name one of
/// them, so it is answered without asking OpenStack.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Size in GiB for a capacity range: `required_bytes` rounded up, 1 GiB
/// when absent, never above `limit_bytes`.
pub fn size_gib(range: Option<&csi::CapacityRange>) -> DriverResult<i64> {
    let Some(r) = range else {
        return Ok(1);
    };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(DriverError::InvalidArgument(
            "capacity_range bytes must not be negative".into(),
        ));
    }
    if r.limit_bytes > 0 && r.required_bytes > r.limit_bytes {
        return Err(DriverError::InvalidArgument(format!(
            "required_bytes {} exceeds limit_bytes {}",
            r.required_bytes, r.limit_bytes
        )));
    }
    let gib = if r.required_bytes == 0 {
        1
    } else {
        ceil_gib(r.required_bytes)
    };
    if gib > MAX_VOLUME_GIB {
        return Err(DriverError::OutOfRange(format!(
            "{gib} GiB is more than the {MAX_VOLUME_GIB} GiB this driver asks OpenStack for"
        )));
    }
    if r.limit_bytes > 0 && gib.saturating_mul(GIB) > r.limit_bytes {
        return Err(DriverError::OutOfRange(format!(
            "OpenStack sizes volumes in whole GiB: {gib} GiB exceeds limit_bytes {}",
            r.limit_bytes
        )));
    }
    Ok(gib)
}

/// The size an expansion asks for: a capacity range is required, with
/// `required_bytes` or `limit_bytes`.
pub fn expansion_gib(range: Option<&csi::CapacityRange>) -> DriverResult<i64> {
    let range =
        range.ok_or_else(|| DriverError::InvalidArgument("capacity_range is required".into()))?;
    if range.required_bytes <= 0 && range.limit_bytes <= 0 {
        return Err(DriverError::InvalidArgument(
            "capacity_range needs required_bytes or limit_bytes".into(),
        ));
    }
    size_gib(Some(range))
}

fn ceil_gib(bytes: i64) -> i64 {
    bytes / GIB + i64::from(bytes % GIB != 0)
}

/// Whether a volume of `size_gib` satisfies `range`.
pub fn size_fits(size_gib: i64, range: Option<&csi::CapacityRange>) -> bool {
    let Some(r) = range else {
        return true;
    };
    let bytes = size_gib.saturating_mul(GIB);
    bytes >= r.required_bytes && (r.limit_bytes == 0 || bytes <= r.limit_bytes)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessType {
    Block,
    Mount,
}

/// A capability checked for shape: access type and a known access mode.
#[derive(Debug, Clone)]
pub struct Capability {
    pub access_type: AccessType,
    pub mode: Mode,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

impl Capability {
    pub fn multi_node(&self) -> bool {
        matches!(
            self.mode,
            Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
        )
    }

    pub fn read_only_mode(&self) -> bool {
        matches!(
            self.mode,
            Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly
        )
    }
}

/// Checks a capability's shape: an access mode, an access type, mount
/// flags that do not turn the mount into something else. The driver checks
/// what its storage can serve.
pub fn parse_capability(c: &csi::VolumeCapability) -> DriverResult<Capability> {
    let mode = c
        .access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok())
        .filter(|m| *m != Mode::Unknown)
        .ok_or_else(|| {
            DriverError::InvalidArgument("volume capability has no valid access mode".into())
        })?;
    let (access_type, fs_type, mount_flags) = match &c.access_type {
        Some(csi::volume_capability::AccessType::Block(_)) => {
            (AccessType::Block, String::new(), Vec::new())
        }
        Some(csi::volume_capability::AccessType::Mount(m)) => {
            if !m.volume_mount_group.is_empty() {
                return Err(DriverError::InvalidArgument(
                    "volume_mount_group is not supported (the CSIDriver's fsGroupPolicy applies fsGroup)".into(),
                ));
            }
            host_ops::MountOptions::parse(&m.mount_flags)
                .map_err(|e| DriverError::InvalidArgument(e.to_string()))?;
            (AccessType::Mount, m.fs_type.clone(), m.mount_flags.clone())
        }
        None => {
            return Err(DriverError::InvalidArgument(
                "volume capability has no access type (block or mount)".into(),
            ));
        }
    };
    Ok(Capability {
        access_type,
        mode,
        fs_type,
        mount_flags,
    })
}

/// A request's capabilities (at least one), each through the driver's
/// own `parse` (the shared check plus what its storage can serve).
pub fn parse_capabilities(
    caps: &[csi::VolumeCapability],
    parse: impl Fn(&csi::VolumeCapability) -> DriverResult<Capability>,
) -> DriverResult<Vec<Capability>> {
    if caps.is_empty() {
        return Err(DriverError::InvalidArgument(
            "volume_capabilities are required".into(),
        ));
    }
    caps.iter().map(parse).collect()
}

/// OpenStack's `created_at` (`2024-05-01T10:00:00.000000`, UTC without a
/// zone; Cinder and Manila alike) as a protobuf timestamp.
pub fn timestamp(created_at: Option<&str>) -> Option<prost_types::Timestamp> {
    let s = created_at?;
    let s = s.trim_end_matches('Z');
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let frac: String = frac
        .chars()
        .take_while(char::is_ascii_digit)
        .take(9)
        .collect();
    let nanos = format!("{frac:0<9}").parse::<i32>().ok()?;
    // days from civil (Howard Hinnant's algorithm)
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(prost_types::Timestamp {
        seconds: days * 86400 + hh * 3600 + mm * 60 + ss,
        nanos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("30S"), Some(Duration::from_secs(30)));
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
    }

    #[test]
    fn sizes_round_up_and_respect_limits() {
        let r = |req, lim| csi::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        };
        assert_eq!(size_gib(None).unwrap(), 1);
        assert_eq!(size_gib(Some(&r(1, 0))).unwrap(), 1);
        assert_eq!(size_gib(Some(&r(GIB + 1, 0))).unwrap(), 2);
        assert_eq!(size_gib(Some(&r(0, 0))).unwrap(), 1);
        assert!(matches!(
            size_gib(Some(&r(-1, 0))),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            size_gib(Some(&r(GIB + 1, GIB + 2))),
            Err(DriverError::OutOfRange(_))
        ));
        assert!(matches!(
            size_gib(Some(&r(3 * GIB, GIB))),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            size_gib(Some(&r(i64::MAX, 0))),
            Err(DriverError::OutOfRange(_))
        ));
        assert_eq!(
            size_gib(Some(&r(MAX_VOLUME_GIB * GIB, 0))).unwrap(),
            MAX_VOLUME_GIB
        );
        assert!(size_fits(2, Some(&r(GIB, 2 * GIB))));
        assert!(!size_fits(3, Some(&r(GIB, 2 * GIB))));
    }

    #[test]
    fn a_callers_timeout_is_capped() {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", "99999999H".parse().unwrap());
        let d = deadline_from(&m);
        assert!(d <= Instant::now() + MAX_RPC_TIMEOUT);
        assert!(d > Instant::now() + MAX_RPC_TIMEOUT / 2);
    }

    #[test]
    fn the_reply_keeps_a_margin_of_the_callers_deadline() {
        let within = |header: &str| {
            let mut m = MetadataMap::new();
            m.insert("grpc-timeout", header.parse().unwrap());
            deadline_from(&m).saturating_duration_since(Instant::now())
        };
        // short deadlines keep the floor for the reply
        let d = within("600m");
        assert!(
            d <= Duration::from_millis(400) && d > Duration::from_millis(300),
            "{d:?}"
        );
        // twenty seconds keep a twentieth; three minutes, the cap
        let d = within("20S");
        assert!(
            d <= Duration::from_secs(19) && d > Duration::from_secs(18),
            "{d:?}"
        );
        let d = within("3M");
        assert!(
            d <= Duration::from_secs(178) && d > Duration::from_secs(177),
            "{d:?}"
        );
    }

    #[test]
    fn uuids() {
        assert!(is_uuid("5d4d6bb2-0000-4000-8000-00000000000a"));
        assert!(!is_uuid("some-fake-volume-id"));
        assert!(!is_uuid("5d4d6bb2-0000-4000-8000-00000000000a/../x"));
    }

    #[test]
    fn cinder_timestamps() {
        let t = timestamp(Some("1970-01-02T00:00:01.500000")).unwrap();
        assert_eq!((t.seconds, t.nanos), (86401, 500_000_000));
        let t = timestamp(Some("2024-03-01T12:00:00")).unwrap();
        assert_eq!(t.seconds, 1_709_294_400);
        assert!(timestamp(Some("garbage")).is_none());
    }
}
