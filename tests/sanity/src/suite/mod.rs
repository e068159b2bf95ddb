//! The controller, node, snapshot and expansion checks, in the manner of
//! csi-sanity: missing and invalid arguments and unknown ids must get the
//! codes the CSI spec requires, every mutating call is repeated to prove
//! idempotency, and full lifecycles run on real mounts.
//!
//! A check returns `Ok` (pass), `Err(problem)` (a violation) or is skipped
//! when the plugin does not advertise the capability it needs. Volumes
//! and snapshots a check creates are deleted at the end of the run.
//!
//! This file holds the suite's configuration, report and run; the checks
//! live by RPC family: [`controller`] (volumes), [`snapshots`], [`node`],
//! [`lifecycle`] (real mounts), [`groups`] (group snapshots) and
//! [`modify`] (names and VolumeAttributesClasses).

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::time::Duration;

use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::controller_service_capability::rpc::Type as CRpc;
use proto::csi::v1::group_controller_client::GroupControllerClient;
use proto::csi::v1::identity_client::IdentityClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::node_service_capability::rpc::Type as NRpc;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;
use tonic::{Code, Status};

mod controller;
mod groups;
mod lifecycle;
mod modify;
mod node;
mod snapshots;

use proto::csi::v1::group_controller_service_capability::rpc::Type as GRpc;

const GIB: i64 = 1 << 30;
const FAKE_VOLUME: &str = "00000000-0000-4000-8000-0000000000ff";
const FAKE_NODE: &str = "00000000-0000-4000-8000-0000000000fe";

/// What the run needs to know about the plugin under test.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    pub socket: PathBuf,
    /// A directory the node plugin accepts staging and target paths under.
    pub mount_dir: PathBuf,
    /// StorageClass parameters for CreateVolume (`--csi.testvolumeparameters`).
    pub parameters: HashMap<String, String>,
    /// Secrets passed to every call that takes them.
    pub secrets: HashMap<String, String>,
    pub volume_size: i64,
    pub fs_type: String,
    /// Filesystem of the online-expansion lifecycle (growing ext4 online
    /// needs CAP_SYS_RESOURCE, which some sandboxes lack; xfs does not).
    pub expansion_fs_type: String,
    /// Per-call deadline.
    pub timeout: Duration,
    /// The driver serves raw block volumes; if not, asking for one must be
    /// InvalidArgument.
    pub block: bool,
    /// The driver serves one volume to several publishers at once
    /// (multi-node mount modes: RWX file systems).
    pub shared: bool,
    /// After ControllerExpandVolume without node expansion, the node's
    /// usage shows the new size (a share whose quota is its size).
    pub quota_on_node: bool,
    /// Where the node plugin's mounts are seen from, when it runs in
    /// another mount namespace (`/proc/<pid>`): its `root` and
    /// `mountinfo`.
    pub node_view: Option<PathBuf>,
    /// VolumeSnapshotClass parameters to take snapshots with beyond the
    /// default class (e.g. Cinder's `type: backup`): each gets a data
    /// lifecycle (written, snapshotted in use, restored, read, deleted).
    pub snapshot_classes: Vec<HashMap<String, String>>,
    /// The backend refuses an attachment past the node's
    /// `max_volumes_per_node` (Nova's per-server disk limit set to match):
    /// publishing one more must be ResourceExhausted.
    pub attach_limit_enforced: bool,
    /// VolumeGroupSnapshotClass parameters for CreateVolumeGroupSnapshot.
    pub group_snapshot_parameters: HashMap<String, String>,
    /// A restored volume holds its snapshot's data on this node; false
    /// where the node's mounts stand in for the storage (the emulator's
    /// bind-mounted export directories, which no snapshot copies): the
    /// group lifecycle then checks that each member restores and mounts.
    pub restores_hold_data: bool,
    /// Why the group snapshot lifecycle cannot pass on this backend (it is
    /// then a skip with that reason; the argument checks still run).
    pub group_lifecycle_unsupported: Option<String>,
    /// VolumeAttributesClass parameters the driver can change
    /// (`--csi.testvolumemutableparameters`): ControllerModifyVolume's
    /// checks need them when MODIFY_VOLUME is advertised.
    pub mutable_parameters: HashMap<String, String>,
}

impl SuiteConfig {
    pub fn new(socket: impl Into<PathBuf>, mount_dir: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mount_dir: mount_dir.into(),
            parameters: HashMap::new(),
            secrets: HashMap::new(),
            volume_size: GIB,
            fs_type: "ext4".into(),
            expansion_fs_type: "ext4".into(),
            timeout: Duration::from_secs(60),
            block: true,
            shared: false,
            quota_on_node: false,
            node_view: None,
            attach_limit_enforced: false,
            snapshot_classes: Vec::new(),
            group_snapshot_parameters: HashMap::new(),
            restores_hold_data: true,
            group_lifecycle_unsupported: None,
            mutable_parameters: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: &'static str,
    pub outcome: Outcome,
}

#[derive(Debug, Default)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn failures(&self) -> Vec<&CheckResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
            .collect()
    }
    pub fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.results {
            match &r.outcome {
                Outcome::Pass => writeln!(f, "PASS {}", r.name)?,
                Outcome::Fail(p) => writeln!(f, "FAIL {}: {p}", r.name)?,
                Outcome::Skip(why) => writeln!(f, "SKIP {}: {why}", r.name)?,
            }
        }
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.count(|o| *o == Outcome::Pass),
            self.count(|o| matches!(o, Outcome::Fail(_))),
            self.count(|o| matches!(o, Outcome::Skip(_)))
        )
    }
}

type Check = Result<(), String>;

enum Skip {
    No,
    Because(String),
}

pub struct Suite {
    cfg: SuiteConfig,
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    group_controller: GroupControllerClient<Channel>,
    node: NodeClient<Channel>,
    controller_caps: Vec<CRpc>,
    has_group_controller: bool,
    group_caps: Vec<GRpc>,
    node_caps: Vec<NRpc>,
    has_controller: bool,
    node_id: Option<String>,
    max_volumes_per_node: i64,
    volumes: Vec<String>,
    snapshots: Vec<String>,
    seq: u32,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("socket", &self.cfg.socket)
            .finish()
    }
}

fn expect_code<T>(r: Result<tonic::Response<T>, Status>, want: Code, what: &str) -> Check {
    match r {
        Ok(_) => Err(format!("{what}: succeeded, expected {want:?}")),
        Err(s) if s.code() == want => Ok(()),
        Err(s) => Err(format!(
            "{what}: got {:?} ({}), expected {want:?}",
            s.code(),
            s.message()
        )),
    }
}

fn ok<T>(r: Result<tonic::Response<T>, Status>, what: &str) -> Result<T, String> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| format!("{what}: {:?}: {}", s.code(), s.message()))
}

fn ensure(cond: bool, problem: impl FnOnce() -> String) -> Check {
    if cond { Ok(()) } else { Err(problem()) }
}

fn mount_cap(fs: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.to_string(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn from_snapshot(id: &str) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: id.to_string(),
            },
        )),
    }
}

fn from_volume(id: &str) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: id.to_string(),
            },
        )),
    }
}

impl Suite {
    pub async fn connect(cfg: SuiteConfig) -> Result<Self, tonic::transport::Error> {
        let ch = plugin_runtime::connect_unix(&cfg.socket).await?;
        let mut s = Self {
            identity: IdentityClient::new(ch.clone()),
            controller: ControllerClient::new(ch.clone()),
            group_controller: GroupControllerClient::new(ch.clone()),
            node: NodeClient::new(ch),
            cfg,
            controller_caps: Vec::new(),
            has_group_controller: false,
            group_caps: Vec::new(),
            node_caps: Vec::new(),
            has_controller: false,
            node_id: None,
            max_volumes_per_node: 0,
            volumes: Vec::new(),
            snapshots: Vec::new(),
            seq: 0,
        };
        s.discover().await;
        Ok(s)
    }

    /// Whether something is mounted at `path` where the node plugin is.
    fn mounted(&self, path: &std::path::Path) -> bool {
        match &self.cfg.node_view {
            None => host_ops::mounts_at(path)
                .map(|m| !m.is_empty())
                .unwrap_or(false),
            Some(view) => host_ops::mountinfo::parse(
                &std::fs::read_to_string(view.join("mountinfo")).unwrap_or_default(),
            )
            .iter()
            .any(|m| m.mount_point == path),
        }
    }

    /// `path` as the node plugin sees it.
    fn seen(&self, path: &std::path::Path) -> PathBuf {
        match &self.cfg.node_view {
            None => path.to_path_buf(),
            Some(view) => view
                .join("root")
                .join(path.strip_prefix("/").unwrap_or(path)),
        }
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.cfg.timeout);
        r
    }

    async fn discover(&mut self) {
        use csi::plugin_capability::Type;
        if let Ok(r) = self
            .identity
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
        {
            let caps = r.into_inner().capabilities;
            let has = |t: csi::plugin_capability::service::Type| {
                caps.iter()
                    .any(|c| matches!(&c.r#type, Some(Type::Service(s)) if s.r#type == t as i32))
            };
            self.has_controller = has(csi::plugin_capability::service::Type::ControllerService);
            self.has_group_controller =
                has(csi::plugin_capability::service::Type::GroupControllerService);
        }
        if self.has_group_controller
            && let Ok(r) = self
                .group_controller
                .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
                .await
        {
            self.group_caps = r
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::group_controller_service_capability::Type::Rpc(r)) => {
                        GRpc::try_from(r.r#type).ok()
                    }
                    None => None,
                })
                .collect();
        }
        if self.has_controller
            && let Ok(r) = self
                .controller
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
        {
            self.controller_caps = r
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::controller_service_capability::Type::Rpc(r)) => {
                        CRpc::try_from(r.r#type).ok()
                    }
                    None => None,
                })
                .collect();
        }
        if let Ok(r) = self
            .node
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
        {
            self.node_caps = r
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(csi::node_service_capability::Type::Rpc(r)) => {
                        NRpc::try_from(r.r#type).ok()
                    }
                    None => None,
                })
                .collect();
        }
        if let Ok(r) = self.node.node_get_info(csi::NodeGetInfoRequest {}).await {
            let info = r.into_inner();
            self.node_id = Some(info.node_id);
            self.max_volumes_per_node = info.max_volumes_per_node;
        }
    }

    fn name(&mut self, what: &str) -> String {
        self.seq += 1;
        format!("sanity-{what}-{}-{}", std::process::id(), self.seq)
    }

    fn create_req(
        &self,
        name: &str,
        cap: csi::VolumeCapability,
        size: i64,
    ) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap],
            parameters: self.cfg.parameters.clone(),
            secrets: self.cfg.secrets.clone(),
            ..Default::default()
        }
    }

    async fn create_volume(
        &mut self,
        name: &str,
        cap: csi::VolumeCapability,
    ) -> Result<csi::Volume, String> {
        let req = self.create_req(name, cap, self.cfg.volume_size);
        self.send_create(req, "CreateVolume").await
    }

    /// CreateVolume as asked; the volume is tracked for the cleanup.
    async fn send_create(
        &mut self,
        req: csi::CreateVolumeRequest,
        what: &str,
    ) -> Result<csi::Volume, String> {
        let v = ok(self.controller.create_volume(self.req(req)).await, what)?
            .volume
            .ok_or_else(|| format!("{what}: CreateVolume returned no volume"))?;
        if !self.volumes.contains(&v.volume_id) {
            self.volumes.push(v.volume_id.clone());
        }
        Ok(v)
    }

    async fn new_volume(
        &mut self,
        what: &str,
        cap: csi::VolumeCapability,
    ) -> Result<csi::Volume, String> {
        let name = self.name(what);
        self.create_volume(&name, cap).await
    }

    /// DeleteSnapshot, then the snapshot untracked and checked gone
    /// everywhere (deleted means deleted when it answers).
    async fn delete_snapshot(&mut self, id: &str) -> Check {
        let req = csi::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            secrets: self.cfg.secrets.clone(),
        };
        ok(
            self.controller.delete_snapshot(self.req(req)).await,
            "DeleteSnapshot",
        )?;
        self.snapshots.retain(|s| s != id);
        self.snapshot_gone(id).await
    }

    async fn delete_volume(&mut self, id: &str) -> Check {
        let req = csi::DeleteVolumeRequest {
            volume_id: id.into(),
            secrets: self.cfg.secrets.clone(),
        };
        ok(
            self.controller.delete_volume(self.req(req)).await,
            "DeleteVolume",
        )?;
        self.volumes.retain(|v| v != id);
        Ok(())
    }

    fn publish_req(
        &self,
        volume_id: &str,
        node_id: &str,
        cap: csi::VolumeCapability,
    ) -> csi::ControllerPublishVolumeRequest {
        csi::ControllerPublishVolumeRequest {
            volume_id: volume_id.into(),
            node_id: node_id.into(),
            volume_capability: Some(cap),
            readonly: false,
            secrets: self.cfg.secrets.clone(),
            volume_context: HashMap::new(),
        }
    }

    fn controller_skip(&self, cap: CRpc) -> Skip {
        if !self.has_controller {
            Skip::Because("no controller service".into())
        } else if !self.controller_caps.contains(&cap) {
            Skip::Because(format!(
                "controller capability {} not advertised",
                cap.as_str_name()
            ))
        } else {
            Skip::No
        }
    }

    fn lifecycle_skip(&self) -> Skip {
        if let Skip::Because(w) = self.controller_skip(CRpc::CreateDeleteVolume) {
            return Skip::Because(w);
        }
        if !self.node_caps.contains(&NRpc::StageUnstageVolume) || self.node_id.is_none() {
            return Skip::Because(
                "needs a node service with STAGE_UNSTAGE_VOLUME and a node id".into(),
            );
        }
        Skip::No
    }

    /// Runs every check and cleans up what they left behind.
    pub async fn run(mut self) -> Report {
        let mut report = Report::default();
        macro_rules! check {
            ($name:literal, $skip:expr, $body:ident) => {{
                let outcome = match $skip {
                    Skip::Because(why) => Outcome::Skip(why),
                    Skip::No => match self.$body().await {
                        Ok(()) => Outcome::Pass,
                        Err(p) => Outcome::Fail(p),
                    },
                };
                report.results.push(CheckResult {
                    name: $name,
                    outcome,
                });
            }};
        }
        check!(
            "Controller/GetCapabilities: known capabilities only",
            if self.has_controller {
                Skip::No
            } else {
                Skip::Because("no controller service".into())
            },
            controller_caps_known
        );
        check!(
            "CreateVolume: missing name or capabilities -> InvalidArgument",
            self.controller_skip(CRpc::CreateDeleteVolume),
            create_bad_args
        );
        check!(
            "CreateVolume: same request twice -> same volume, also without a capacity range",
            self.controller_skip(CRpc::CreateDeleteVolume),
            create_idempotent
        );
        check!(
            "CreateVolume: same name, other size -> AlreadyExists",
            self.controller_skip(CRpc::CreateDeleteVolume),
            create_conflict
        );
        check!(
            "CreateVolume/CreateSnapshot: maximum-length (128-character) names, twice each",
            self.controller_skip(CRpc::CreateDeleteVolume),
            max_length_names
        );
        check!(
            "ControllerModifyVolume: arguments, unknown volume, unsupported parameters (also at creation); a volume created without and one with a class modified, twice",
            self.modify_skip(),
            modify_rules
        );
        check!(
            "DeleteVolume: missing id -> InvalidArgument; unknown id and repeats -> OK",
            self.controller_skip(CRpc::CreateDeleteVolume),
            delete_rules
        );
        check!(
            "ValidateVolumeCapabilities: arguments, unknown volume, confirmation",
            self.controller_skip(CRpc::CreateDeleteVolume),
            validate_rules
        );
        check!(
            "ListVolumes: pagination covers created volumes; bad token -> Aborted",
            self.controller_skip(CRpc::ListVolumes),
            list_volumes_rules
        );
        check!(
            "ControllerGetVolume: arguments, unknown volume, published nodes",
            self.controller_skip(CRpc::GetVolume),
            get_volume_rules
        );
        check!(
            "ControllerPublishVolume: arguments and unknown ids",
            self.controller_skip(CRpc::PublishUnpublishVolume),
            publish_bad_args
        );
        check!(
            "ControllerPublish/Unpublish: repeated calls are idempotent",
            match self.lifecycle_skip() {
                Skip::No => self.controller_skip(CRpc::PublishUnpublishVolume),
                s => s,
            },
            publish_idempotent
        );
        check!(
            "CreateSnapshot/DeleteSnapshot: arguments and idempotency",
            self.controller_skip(CRpc::CreateDeleteSnapshot),
            snapshot_rules
        );
        check!(
            "ListSnapshots: by id, by source, paginated",
            self.controller_skip(CRpc::ListSnapshots),
            list_snapshots_rules
        );
        check!(
            "CreateVolume from a snapshot and from a volume",
            self.controller_skip(CRpc::CreateDeleteSnapshot),
            create_from_sources
        );
        check!(
            "Deletion is done when it answers: gone from lists and gets, a snapshot's source deletes at once",
            self.controller_skip(CRpc::CreateDeleteVolume),
            deletion_complete
        );
        check!(
            "GetSnapshot: arguments, unknown id, a created snapshot",
            self.controller_skip(CRpc::GetSnapshot),
            get_snapshot_rules
        );
        check!(
            "SINGLE_NODE_SINGLE/MULTI_WRITER: created and confirmed",
            self.controller_skip(CRpc::SingleNodeMultiWriter),
            single_node_modes
        );
        check!(
            "ControllerPublishVolume: one more than max_volumes_per_node -> ResourceExhausted, nothing attached",
            match self.controller_skip(CRpc::PublishUnpublishVolume) {
                Skip::No if !self.cfg.attach_limit_enforced =>
                    Skip::Because("the backend here enforces no per-node attach limit".into(),),
                Skip::No if self.max_volumes_per_node <= 0 || self.max_volumes_per_node > 64 => {
                    Skip::Because(format!(
                        "max_volumes_per_node {} is not a limit to fill",
                        self.max_volumes_per_node
                    ))
                }
                Skip::No if self.node_id.is_none() => Skip::Because("no node id".into()),
                s => s,
            },
            attach_limit
        );
        for class in self.cfg.snapshot_classes.clone() {
            let mut keys: Vec<String> = class.iter().map(|(k, v)| format!("{k}={v}")).collect();
            keys.sort();
            let outcome = match (
                self.lifecycle_skip(),
                self.controller_skip(CRpc::CreateDeleteSnapshot),
            ) {
                (Skip::Because(why), _) | (_, Skip::Because(why)) => Outcome::Skip(why),
                (Skip::No, Skip::No) => match self.snapshot_class_lifecycle(class).await {
                    Ok(()) => Outcome::Pass,
                    Err(p) => Outcome::Fail(format!("{}: {p}", keys.join(","))),
                },
            };
            report.results.push(CheckResult {
                name: "Snapshot class lifecycle: data written, snapshotted in use, restored and read, deleted",
                outcome,
            });
        }
        check!(
            "GroupController: capabilities; Create/Get/Delete arguments and unknown ids",
            self.group_skip(),
            group_rules
        );
        check!(
            "Volume group snapshot lifecycle: idempotent, consistent data, members restored one by one, deleted with the group",
            match (self.group_skip(), &self.cfg.group_lifecycle_unsupported) {
                (Skip::No, Some(why)) => Skip::Because(why.clone()),
                (Skip::No, None) => self.lifecycle_skip(),
                (s, _) => s,
            },
            group_lifecycle
        );
        check!(
            "ControllerExpandVolume: arguments, growth, repeat",
            self.controller_skip(CRpc::ExpandVolume),
            controller_expand_rules
        );
        check!(
            "Node/GetCapabilities and NodeGetInfo",
            Skip::No,
            node_info_rules
        );
        check!(
            "Node calls: missing arguments -> InvalidArgument",
            Skip::No,
            node_bad_args
        );
        check!(
            "NodeGetVolumeStats/NodeExpandVolume: absent or relative path -> NotFound",
            if self.node_caps.contains(&NRpc::GetVolumeStats)
                || self.node_caps.contains(&NRpc::ExpandVolume)
            {
                Skip::No
            } else {
                Skip::Because("neither GET_VOLUME_STATS nor EXPAND_VOLUME advertised".into())
            },
            node_paths_not_found
        );
        check!(
            "Lifecycle (filesystem): create, publish, stage x2, publish x2, write, stats, unpublish x2, unstage x2, unpublish x2, delete x2",
            self.lifecycle_skip(),
            lifecycle_mount
        );
        check!(
            "Lifecycle (raw block), or InvalidArgument from a driver without block",
            self.lifecycle_skip(),
            lifecycle_block
        );
        check!(
            "Lifecycle (shared): two publishers see each other's writes, a read-only one refuses",
            self.lifecycle_skip(),
            lifecycle_shared
        );
        check!(
            "NodePublishVolume: SINGLE_NODE_SINGLE_WRITER at one target path only -> FailedPrecondition at a second, nothing mounted; SINGLE_NODE_MULTI_WRITER at two",
            match self.lifecycle_skip() {
                Skip::No if !self.node_caps.contains(&NRpc::SingleNodeMultiWriter) =>
                    Skip::Because("node capability SINGLE_NODE_MULTI_WRITER not advertised".into(),),
                s => s,
            },
            single_writer_publish
        );
        check!(
            "Lifecycle with expansion: controller (then node), data kept",
            match self.lifecycle_skip() {
                Skip::No => self.controller_skip(CRpc::ExpandVolume),
                s => s,
            },
            lifecycle_expand
        );
        self.cleanup().await;
        report
    }

    async fn cleanup(&mut self) {
        for s in std::mem::take(&mut self.snapshots) {
            let req = csi::DeleteSnapshotRequest {
                snapshot_id: s,
                secrets: self.cfg.secrets.clone(),
            };
            let _ = self.controller.delete_snapshot(self.req(req)).await;
        }
        for v in std::mem::take(&mut self.volumes) {
            if let Some(node) = self.node_id.clone() {
                let req = csi::ControllerUnpublishVolumeRequest {
                    volume_id: v.clone(),
                    node_id: node,
                    secrets: self.cfg.secrets.clone(),
                };
                let _ = self
                    .controller
                    .controller_unpublish_volume(self.req(req))
                    .await;
            }
            let req = csi::DeleteVolumeRequest {
                volume_id: v,
                secrets: self.cfg.secrets.clone(),
            };
            let _ = self.controller.delete_volume(self.req(req)).await;
        }
    }
}
