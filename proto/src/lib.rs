//! gRPC types for the Container Storage Interface (v1.12) and the Kubernetes
//! KMS v2 plugin API.
//!
//! Messages that carry secrets (every CSI field marked `csi_secret`, KMS
//! plaintexts and ciphertexts, CSI mount flags) print `<redacted>` in place
//! of those fields when formatted with `{:?}`.

#![allow(missing_debug_implementations, clippy::all, clippy::pedantic)]

/// Stands in for a secret field in `Debug` output.
pub struct Redacted;

impl core::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("<redacted>")
    }
}

// `GRPC_METHODS`: every method path of the CSI and KMS v2 services.
include!(concat!(env!("OUT_DIR"), "/grpc_methods.rs"));

pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
        include!(concat!(env!("OUT_DIR"), "/csi.v1.redacted_debug.rs"));
    }
}

pub mod kms {
    pub mod v2 {
        tonic::include_proto!("v2");
        include!(concat!(env!("OUT_DIR"), "/v2.redacted_debug.rs"));
    }
}

#[cfg(test)]
mod tests {
    use super::csi::v1 as csi;
    use super::kms::v2 as kms;

    #[test]
    fn csi_secrets_are_redacted_in_debug() {
        let req = csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            secrets: [("password".to_string(), "hunter2-secret".to_string())].into(),
            ..Default::default()
        };
        let printed = format!("{req:?}");
        assert!(printed.contains("pvc-1"), "{printed}");
        assert!(!printed.contains("hunter2-secret"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");

        let stage = csi::NodeStageVolumeRequest {
            volume_id: "v".into(),
            secrets: [("k".to_string(), "stage-secret".to_string())].into(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume {
                        fs_type: "ext4".into(),
                        mount_flags: vec!["password=flag-secret".into()],
                        volume_mount_group: String::new(),
                    },
                )),
                access_mode: None,
            }),
            ..Default::default()
        };
        let printed = format!("{stage:?}");
        assert!(!printed.contains("stage-secret"), "{printed}");
        assert!(!printed.contains("flag-secret"), "{printed}");
        assert!(printed.contains("ext4"), "{printed}");
    }

    /// Every CSI message with a field the spec marks `csi_secret`: the
    /// list is held to the one build.rs derived from csi.proto, so that a
    /// message a new CSI version adds cannot go untested.
    #[test]
    fn every_request_with_secrets_redacts_them() {
        let secret = || [("s".to_string(), "TOPSECRET".to_string())].into();
        let printed = [
            (
                "ControllerExpandVolumeRequest",
                format!(
                    "{:?}",
                    csi::ControllerExpandVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "ControllerModifyVolumeRequest",
                format!(
                    "{:?}",
                    csi::ControllerModifyVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "ControllerPublishVolumeRequest",
                format!(
                    "{:?}",
                    csi::ControllerPublishVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "ControllerUnpublishVolumeRequest",
                format!(
                    "{:?}",
                    csi::ControllerUnpublishVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "CreateSnapshotRequest",
                format!(
                    "{:?}",
                    csi::CreateSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "CreateVolumeGroupSnapshotRequest",
                format!(
                    "{:?}",
                    csi::CreateVolumeGroupSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "CreateVolumeRequest",
                format!(
                    "{:?}",
                    csi::CreateVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "DeleteSnapshotRequest",
                format!(
                    "{:?}",
                    csi::DeleteSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "DeleteVolumeGroupSnapshotRequest",
                format!(
                    "{:?}",
                    csi::DeleteVolumeGroupSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "DeleteVolumeRequest",
                format!(
                    "{:?}",
                    csi::DeleteVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "GetSnapshotRequest",
                format!(
                    "{:?}",
                    csi::GetSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "GetVolumeGroupSnapshotRequest",
                format!(
                    "{:?}",
                    csi::GetVolumeGroupSnapshotRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "ListSnapshotsRequest",
                format!(
                    "{:?}",
                    csi::ListSnapshotsRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "NodeExpandVolumeRequest",
                format!(
                    "{:?}",
                    csi::NodeExpandVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "NodePublishVolumeRequest",
                format!(
                    "{:?}",
                    csi::NodePublishVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "NodeStageVolumeRequest",
                format!(
                    "{:?}",
                    csi::NodeStageVolumeRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
            (
                "ValidateVolumeCapabilitiesRequest",
                format!(
                    "{:?}",
                    csi::ValidateVolumeCapabilitiesRequest {
                        secrets: secret(),
                        ..Default::default()
                    }
                ),
            ),
        ];
        for (name, p) in &printed {
            assert!(!p.contains("TOPSECRET"), "{name}: {p}");
        }
        let generated = include_str!(concat!(env!("OUT_DIR"), "/csi.v1.redacted_debug.rs"));
        let mut marked: Vec<&str> = generated
            .split("impl ::core::fmt::Debug for ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next())
            .filter(|name| name.ends_with("Request"))
            .collect();
        marked.sort();
        let tested: Vec<&str> = printed.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            tested, marked,
            "the messages carrying secrets, as csi.proto marks them"
        );
    }

    #[test]
    fn kms_plaintext_and_ciphertext_are_redacted() {
        let enc = kms::EncryptRequest {
            plaintext: b"seed-bytes-XYZ".to_vec(),
            uid: "u1".into(),
        };
        let dec = kms::DecryptResponse {
            plaintext: b"seed-bytes-XYZ".to_vec(),
        };
        for p in [format!("{enc:?}"), format!("{dec:?}")] {
            assert!(!p.contains("seed"), "{p}");
            // bytes print as decimal lists: make sure none leaked either
            assert!(!p.contains("115, 101"), "{p}");
        }
        assert!(format!("{enc:?}").contains("u1"));
    }
}
