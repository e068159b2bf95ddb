//! `--pvc-annotations` (upstream's flag): a new volume's placement read
//! from its claim's annotations. The provisioner names the claim in
//! CreateVolume's parameters (`--extra-create-metadata`); the controller
//! reads that claim, once per volume it creates, with its own
//! ServiceAccount (get on persistentvolumeclaims). Lists are
//! comma-separated volume or share names or ids.

use std::collections::{BTreeMap, HashMap};

use crate::errors::{DriverError, DriverResult};
use crate::parameters::{PVC_NAME, PVC_NAMESPACE};

/// At most this many entries in one annotation's list: each is looked up
/// in the cloud, and a claim is written by whoever may create one.
pub const MAX_ENTRIES: usize = 16;
/// The longest entry taken (a Cinder or Manila name is at most 255).
const MAX_ENTRY_LEN: usize = 255;

/// `--pvc-annotations`, a Go-style boolean as upstream's manifests write
/// it (`--pvc-annotations`, `--pvc-annotations=false`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClaimAnnotationsFlag {
    /// Controller: read each new volume's claim for the placement its
    /// annotations ask (see the description above). Needs the
    /// provisioner's --extra-create-metadata, and get on
    /// persistentvolumeclaims for the controller's ServiceAccount.
    #[arg(long = "pvc-annotations", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub pvc_annotations: bool,
}

/// Reads the annotations of the claim a CreateVolume is for.
#[derive(Debug, Clone)]
pub struct ClaimAnnotations {
    client: kube_api::Client,
}

impl ClaimAnnotations {
    pub fn new(client: kube_api::Client) -> Self {
        Self { client }
    }

    /// The reader `--pvc-annotations` asks for, from the apiserver the
    /// orphan report asks too (the pod's own, or --kube-apiserver); none
    /// without the flag. A controller asked for it that has no apiserver
    /// does not start.
    pub fn from_flags(
        flag: &ClaimAnnotationsFlag,
        kube: &crate::orphans::reporter::KubeArgs,
    ) -> Result<Option<Self>, crate::plugin::PluginError> {
        if !flag.pvc_annotations {
            return Ok(None);
        }
        let client = kube.client().map_err(|e| {
            crate::plugin::PluginError::Flags(format!(
                "--pvc-annotations needs the Kubernetes API: {e}"
            ))
        })?;
        Ok(Some(Self::new(client)))
    }

    /// The claim's annotations, or None when the parameters name no claim
    /// (no --extra-create-metadata, or a CreateVolume from elsewhere) or
    /// the claim is gone.
    pub async fn of_request(
        &self,
        parameters: &HashMap<String, String>,
    ) -> DriverResult<Option<BTreeMap<String, String>>> {
        let (Some(namespace), Some(name)) =
            (parameters.get(PVC_NAMESPACE), parameters.get(PVC_NAME))
        else {
            return Ok(None);
        };
        match self.client.pvc_annotations(namespace, name).await {
            Ok(a) => Ok(a),
            Err(kube_api::KubeError::Config(why)) => Err(DriverError::InvalidArgument(why)),
            Err(e) if e.status() == Some(403) => Err(DriverError::FailedPrecondition(format!(
                "--pvc-annotations: the controller may not read claim {namespace}/{name}: \
                 its ServiceAccount needs get on persistentvolumeclaims ({e})"
            ))),
            Err(e) => Err(DriverError::Unavailable(format!(
                "--pvc-annotations: reading claim {namespace}/{name}: {e}"
            ))),
        }
    }
}

/// The entries of a comma-separated annotation (trimmed, empty ones
/// dropped, each once); none when the annotation is absent.
pub fn entries(annotations: &BTreeMap<String, String>, key: &str) -> DriverResult<Vec<String>> {
    let Some(value) = annotations.get(key) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = Vec::new();
    for e in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if e.len() > MAX_ENTRY_LEN || e.chars().any(char::is_control) {
            return Err(DriverError::InvalidArgument(format!(
                "the claim's annotation {key} holds {:?}..., which names no volume",
                e.chars().take(40).collect::<String>()
            )));
        }
        if !out.iter().any(|o| o == e) {
            out.push(e.to_string());
        }
    }
    if out.len() > MAX_ENTRIES {
        return Err(DriverError::InvalidArgument(format!(
            "the claim's annotation {key} names {} volumes, more than the {MAX_ENTRIES} taken",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("k".to_string(), v.to_string())])
    }

    #[test]
    fn a_list_is_trimmed_deduplicated_and_bounded() {
        assert_eq!(entries(&a(" x, y ,,x "), "k").unwrap(), ["x", "y"]);
        assert!(entries(&a(""), "k").unwrap().is_empty());
        assert!(entries(&BTreeMap::new(), "k").unwrap().is_empty());
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("v{i}")).collect();
        let e = entries(&a(&many.join(",")), "k").unwrap_err();
        assert!(matches!(e, DriverError::InvalidArgument(_)), "{e}");
        let fits: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("v{i}")).collect();
        assert_eq!(
            entries(&a(&fits.join(",")), "k").unwrap().len(),
            MAX_ENTRIES
        );
        for bad in ["x\ny".to_string(), "v".repeat(256)] {
            assert!(entries(&a(&bad), "k").is_err(), "{bad:?}");
        }
    }
}
