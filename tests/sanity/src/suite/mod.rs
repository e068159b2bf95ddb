//! The controller, node, snapshot and expansion checks, in the manner of
//! csi-sanity: missing and invalid arguments and unknown ids must get the
//! codes the CSI spec requires, every mutating call is repeated to prove
//! idempotency, and full lifecycles run on real mounts.
//!
//! A check returns `Ok` (pass), `Err(problem)` (a violation) or is skipped
//! when the plugin does not advertise the capability it needs. Volumes
//! and snapshots a check creates are deleted at the end of the run.

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

mod groups;
mod modify;

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
            match self.group_skip() {
                Skip::No => self.lifecycle_skip(),
                s => s,
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

    // ------------------------------------------------------------- checks

    async fn controller_caps_known(&mut self) -> Check {
        let r = ok(
            self.controller
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await,
            "ControllerGetCapabilities",
        )?;
        for c in r.capabilities {
            match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(r))
                    if CRpc::try_from(r.r#type).is_ok_and(|t| t != CRpc::Unknown) => {}
                other => return Err(format!("unknown capability {other:?}")),
            }
        }
        Ok(())
    }

    async fn create_bad_args(&mut self) -> Check {
        let mut r = self.create_req(
            "",
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            GIB,
        );
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "no name",
        )?;
        r.name = self.name("nocaps");
        r.volume_capabilities.clear();
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "no capabilities",
        )?;
        r.volume_capabilities = vec![csi::VolumeCapability {
            access_type: None,
            access_mode: None,
        }];
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "empty capability",
        )?;
        r.volume_capabilities = vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)];
        r.capacity_range = Some(csi::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        });
        expect_code(
            self.controller.create_volume(self.req(r)).await,
            Code::InvalidArgument,
            "negative capacity",
        )
    }

    async fn create_idempotent(&mut self) -> Check {
        let name = self.name("idem");
        let a = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let b = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        ensure(a.volume_id == b.volume_id, || {
            format!(
                "two volumes for one name: {} and {}",
                a.volume_id, b.volume_id
            )
        })?;
        ensure(a.capacity_bytes >= self.cfg.volume_size, || {
            format!(
                "capacity {} < requested {}",
                a.capacity_bytes, self.cfg.volume_size
            )
        })?;
        self.delete_volume(&a.volume_id).await?;
        // no capacity range: the driver picks the size, the same each time
        let name = self.name("nosize");
        let mut req = self.create_req(
            &name,
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            0,
        );
        req.capacity_range = None;
        let mut ids = Vec::new();
        for what in ["CreateVolume without a capacity range", "the same again"] {
            ids.push(self.send_create(req.clone(), what).await?.volume_id);
        }
        ensure(ids[0] == ids[1], || {
            format!("two volumes for one name without a size: {ids:?}")
        })?;
        self.delete_volume(&ids[0]).await
    }

    async fn create_conflict(&mut self) -> Check {
        let name = self.name("conflict");
        let a = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let mut r = self.create_req(
            &name,
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            0,
        );
        r.capacity_range = Some(csi::CapacityRange {
            required_bytes: a.capacity_bytes + 2 * GIB,
            limit_bytes: a.capacity_bytes + 3 * GIB,
        });
        expect_code(
            self.controller.create_volume(self.req(r)).await,
            Code::AlreadyExists,
            "same name, larger size",
        )?;
        self.delete_volume(&a.volume_id).await
    }

    async fn delete_rules(&mut self) -> Check {
        let req = |id: &str, s: &HashMap<String, String>| csi::DeleteVolumeRequest {
            volume_id: id.into(),
            secrets: s.clone(),
        };
        expect_code(
            self.controller
                .delete_volume(self.req(req("", &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        ok(
            self.controller
                .delete_volume(self.req(req(FAKE_VOLUME, &self.cfg.secrets)))
                .await,
            "unknown id",
        )?;
        ok(
            self.controller
                .delete_volume(self.req(req("not-a-volume-id", &self.cfg.secrets)))
                .await,
            "malformed id",
        )?;
        let name = self.name("delete");
        let v = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        self.delete_volume(&v.volume_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    async fn validate_rules(&mut self) -> Check {
        let caps = vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)];
        let secrets = self.cfg.secrets.clone();
        let req =
            |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
                volume_id: id.into(),
                volume_capabilities: caps,
                secrets: secrets.clone(),
                ..Default::default()
            };
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req("", caps.clone())))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req(FAKE_VOLUME, caps.clone())))
                .await,
            Code::NotFound,
            "unknown volume",
        )?;
        let name = self.name("validate");
        let v = self.create_volume(&name, caps[0].clone()).await?;
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req(&v.volume_id, vec![])))
                .await,
            Code::InvalidArgument,
            "no capabilities",
        )?;
        let r = ok(
            self.controller
                .validate_volume_capabilities(self.req(req(&v.volume_id, caps.clone())))
                .await,
            "valid request",
        )?;
        ensure(r.confirmed.is_some(), || {
            format!("SINGLE_NODE_WRITER not confirmed: {}", r.message)
        })?;
        self.delete_volume(&v.volume_id).await
    }

    async fn list_volumes_rules(&mut self) -> Check {
        let mut ids = Vec::new();
        for _ in 0..3 {
            let name = self.name("list");
            ids.push(
                self.create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
                    .await?
                    .volume_id,
            );
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_volumes(self.req(csi::ListVolumesRequest {
                        max_entries: 1,
                        starting_token: token.clone(),
                    }))
                    .await,
                "ListVolumes",
            )?;
            ensure(r.entries.len() <= 1, || {
                format!("max_entries 1 returned {}", r.entries.len())
            })?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        for id in &ids {
            ensure(seen.contains(id), || {
                format!("volume {id} missing from the paginated listing")
            })?;
        }
        expect_code(
            self.controller
                .list_volumes(self.req(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: "no-such-token".into(),
                }))
                .await,
            Code::Aborted,
            "bad token",
        )?;
        expect_code(
            self.controller
                .list_volumes(self.req(csi::ListVolumesRequest {
                    max_entries: -1,
                    starting_token: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "negative max_entries",
        )?;
        for id in ids {
            self.delete_volume(&id).await?;
        }
        Ok(())
    }

    async fn get_volume_rules(&mut self) -> Check {
        let req = |id: &str| csi::ControllerGetVolumeRequest {
            volume_id: id.into(),
        };
        expect_code(
            self.controller
                .controller_get_volume(self.req(req("")))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .controller_get_volume(self.req(req(FAKE_VOLUME)))
                .await,
            Code::NotFound,
            "unknown id",
        )?;
        let name = self.name("get");
        let v = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let r = ok(
            self.controller
                .controller_get_volume(self.req(req(&v.volume_id)))
                .await,
            "ControllerGetVolume",
        )?;
        let got = r.volume.ok_or("no volume in the answer")?;
        ensure(got.volume_id == v.volume_id, || {
            format!("asked for {}, got {}", v.volume_id, got.volume_id)
        })?;
        let status = r.status.ok_or("no status")?;
        ensure(status.published_node_ids.is_empty(), || {
            format!(
                "unpublished volume lists nodes {:?}",
                status.published_node_ids
            )
        })?;
        self.delete_volume(&v.volume_id).await
    }

    async fn publish_bad_args(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let node = self.node_id.clone().unwrap_or_else(|| FAKE_NODE.into());
        let r = self.publish_req("", &node, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no volume id",
        )?;
        let r = self.publish_req(FAKE_VOLUME, "", cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no node id",
        )?;
        let mut r = self.publish_req(FAKE_VOLUME, &node, cap.clone());
        r.volume_capability = None;
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no capability",
        )?;
        let r = self.publish_req(FAKE_VOLUME, &node, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::NotFound,
            "unknown volume",
        )?;
        let name = self.name("pubargs");
        let v = self.create_volume(&name, cap.clone()).await?;
        let r = self.publish_req(&v.volume_id, FAKE_NODE, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::NotFound,
            "unknown node",
        )?;
        let r = csi::ControllerUnpublishVolumeRequest {
            volume_id: String::new(),
            node_id: node,
            secrets: self.cfg.secrets.clone(),
        };
        expect_code(
            self.controller
                .controller_unpublish_volume(self.req(r))
                .await,
            Code::InvalidArgument,
            "unpublish without volume id",
        )?;
        self.delete_volume(&v.volume_id).await
    }

    async fn publish_idempotent(&mut self) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let name = self.name("pubidem");
        let v = self.create_volume(&name, cap.clone()).await?;
        let a = ok(
            self.controller
                .controller_publish_volume(self.req(self.publish_req(
                    &v.volume_id,
                    &node,
                    cap.clone(),
                )))
                .await,
            "publish",
        )?;
        let b = ok(
            self.controller
                .controller_publish_volume(self.req(self.publish_req(
                    &v.volume_id,
                    &node,
                    cap.clone(),
                )))
                .await,
            "publish again",
        )?;
        ensure(a.publish_context == b.publish_context, || {
            format!(
                "publish contexts differ: {:?} vs {:?}",
                a.publish_context, b.publish_context
            )
        })?;
        if self.controller_caps.contains(&CRpc::GetVolume) {
            let r = ok(
                self.controller
                    .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                        volume_id: v.volume_id.clone(),
                    }))
                    .await,
                "get",
            )?;
            let nodes = r.status.map(|s| s.published_node_ids).unwrap_or_default();
            ensure(nodes == vec![node.clone()], || {
                format!("published nodes {nodes:?}, expected [{node}]")
            })?;
        }
        let un = || csi::ControllerUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: node.clone(),
            secrets: self.cfg.secrets.clone(),
        };
        ok(
            self.controller
                .controller_unpublish_volume(self.req(un()))
                .await,
            "unpublish",
        )?;
        ok(
            self.controller
                .controller_unpublish_volume(self.req(un()))
                .await,
            "unpublish again",
        )?;
        self.delete_volume(&v.volume_id).await
    }

    async fn snapshot_rules(&mut self) -> Check {
        let s = self.cfg.secrets.clone();
        let snap = |name: &str, src: &str| csi::CreateSnapshotRequest {
            source_volume_id: src.into(),
            name: name.into(),
            secrets: s.clone(),
            parameters: HashMap::new(),
        };
        expect_code(
            self.controller
                .create_snapshot(self.req(snap("", FAKE_VOLUME)))
                .await,
            Code::InvalidArgument,
            "no name",
        )?;
        let n = self.name("snap");
        expect_code(
            self.controller
                .create_snapshot(self.req(snap(&n, "")))
                .await,
            Code::InvalidArgument,
            "no source",
        )?;
        let a = self
            .new_volume(
                "snapsrc",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let b = self
            .new_volume(
                "snapsrc",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let s1 = ok(
            self.controller
                .create_snapshot(self.req(snap(&n, &a.volume_id)))
                .await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s1.snapshot_id.clone());
        let s2 = ok(
            self.controller
                .create_snapshot(self.req(snap(&n, &a.volume_id)))
                .await,
            "CreateSnapshot again",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        ensure(s1.snapshot_id == s2.snapshot_id, || {
            format!(
                "two snapshots for one name: {} {}",
                s1.snapshot_id, s2.snapshot_id
            )
        })?;
        ensure(s1.source_volume_id == a.volume_id, || {
            "wrong source_volume_id".into()
        })?;
        expect_code(
            self.controller
                .create_snapshot(self.req(snap(&n, &b.volume_id)))
                .await,
            Code::AlreadyExists,
            "same name, other source",
        )?;
        let del = |id: &str| csi::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            secrets: s.clone(),
        };
        expect_code(
            self.controller.delete_snapshot(self.req(del(""))).await,
            Code::InvalidArgument,
            "delete without id",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(FAKE_VOLUME)))
                .await,
            "delete unknown snapshot",
        )?;
        // an id of no shape the driver makes is merely not found
        ok(
            self.controller
                .delete_snapshot(self.req(del("reallyfakesnapshotid")))
                .await,
            "delete a malformed snapshot id",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(&s1.snapshot_id)))
                .await,
            "DeleteSnapshot",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(&s1.snapshot_id)))
                .await,
            "DeleteSnapshot again",
        )?;
        self.snapshots.retain(|x| *x != s1.snapshot_id);
        self.snapshot_gone(&s1.snapshot_id).await?;
        self.delete_volume(&a.volume_id).await?;
        self.delete_volume(&b.volume_id).await
    }

    /// Deleted means gone: right after DeleteSnapshot answers, the
    /// snapshot is listed nowhere and GetSnapshot does not find it.
    async fn snapshot_gone(&mut self, id: &str) -> Check {
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: id.into(),
                    secrets: self.cfg.secrets.clone(),
                    ..Default::default()
                }))
                .await,
            "ListSnapshots after DeleteSnapshot",
        )?;
        ensure(r.entries.is_empty(), || {
            format!("snapshot {id} still listed after DeleteSnapshot answered")
        })?;
        if self.controller_caps.contains(&CRpc::GetSnapshot) {
            expect_code(
                self.controller
                    .get_snapshot(self.req(csi::GetSnapshotRequest {
                        snapshot_id: id.into(),
                        secrets: self.cfg.secrets.clone(),
                    }))
                    .await,
                Code::NotFound,
                "GetSnapshot after DeleteSnapshot",
            )?;
        }
        Ok(())
    }

    async fn create_snapshot(&mut self, source: &str) -> Result<csi::Snapshot, String> {
        let name = self.name("snap");
        let req = csi::CreateSnapshotRequest {
            source_volume_id: source.into(),
            name,
            secrets: self.cfg.secrets.clone(),
            parameters: HashMap::new(),
        };
        let s = ok(
            self.controller.create_snapshot(self.req(req)).await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s.snapshot_id.clone());
        Ok(s)
    }

    async fn list_snapshots_rules(&mut self) -> Check {
        let v = self
            .new_volume(
                "lsnap",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(self.create_snapshot(&v.volume_id).await?.snapshot_id);
        }
        let base = csi::ListSnapshotsRequest {
            secrets: self.cfg.secrets.clone(),
            ..Default::default()
        };
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: ids[0].clone(),
                    ..base.clone()
                }))
                .await,
            "by id",
        )?;
        ensure(
            r.entries.len() == 1
                && r.entries[0]
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.snapshot_id == ids[0]),
            || format!("by id returned {:?}", r.entries),
        )?;
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: FAKE_VOLUME.into(),
                    ..base.clone()
                }))
                .await,
            "unknown id",
        )?;
        ensure(r.entries.is_empty(), || {
            "an unknown snapshot id listed something".into()
        })?;
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    source_volume_id: v.volume_id.clone(),
                    ..base.clone()
                }))
                .await,
            "by source",
        )?;
        let by_source: Vec<String> = r
            .entries
            .iter()
            .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
            .collect();
        ensure(
            ids.iter().all(|i| by_source.contains(i)) && by_source.len() == 3,
            || format!("by source: {by_source:?}, expected {ids:?}"),
        )?;
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        max_entries: 2,
                        starting_token: token.clone(),
                        ..base.clone()
                    }))
                    .await,
                "paginated",
            )?;
            ensure(r.entries.len() <= 2, || {
                format!("max_entries 2 returned {}", r.entries.len())
            })?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.snapshot.map(|s| s.snapshot_id)),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        ensure(ids.iter().all(|i| seen.contains(i)), || {
            "pagination lost snapshots".into()
        })?;
        expect_code(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    starting_token: "bogus".into(),
                    ..base.clone()
                }))
                .await,
            Code::Aborted,
            "bad token",
        )?;
        for id in ids {
            self.delete_snapshot(&id).await?;
        }
        self.delete_volume(&v.volume_id).await
    }

    async fn create_from_sources(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let src = self.new_volume("src", cap.clone()).await?;
        let snap = self.create_snapshot(&src.volume_id).await?;
        for _ in 0..200 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        snapshot_id: snap.snapshot_id.clone(),
                        secrets: self.cfg.secrets.clone(),
                        ..Default::default()
                    }))
                    .await,
                "ListSnapshots",
            )?;
            if r.entries
                .iter()
                .any(|e| e.snapshot.as_ref().is_some_and(|s| s.ready_to_use))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let n = self.name("restore");
        let mut req = self.create_req(&n, cap.clone(), self.cfg.volume_size);
        req.volume_content_source = Some(from_snapshot(&snap.snapshot_id));
        let restored = self.send_create(req.clone(), "restore").await?;
        ensure(restored.content_source == req.volume_content_source, || {
            format!("content source not echoed: {:?}", restored.content_source)
        })?;
        let mut bad = req.clone();
        bad.name = self.name("restoremissing");
        bad.volume_content_source = Some(from_snapshot(FAKE_VOLUME));
        expect_code(
            self.controller.create_volume(self.req(bad)).await,
            Code::NotFound,
            "restore from an unknown snapshot",
        )?;
        if self.controller_caps.contains(&CRpc::CloneVolume) {
            let n = self.name("clone");
            let mut req = self.create_req(&n, cap.clone(), self.cfg.volume_size);
            req.volume_content_source = Some(from_volume(&src.volume_id));
            let clone = self.send_create(req.clone(), "clone").await?;
            ensure(clone.content_source == req.volume_content_source, || {
                "clone source not echoed".into()
            })?;
            self.delete_volume(&clone.volume_id).await?;
            let mut bad = req.clone();
            bad.name = self.name("clonemissing");
            bad.volume_content_source = Some(from_volume(FAKE_VOLUME));
            expect_code(
                self.controller.create_volume(self.req(bad)).await,
                Code::NotFound,
                "clone of an unknown volume",
            )?;
        }
        self.delete_volume(&restored.volume_id).await?;
        self.delete_snapshot(&snap.snapshot_id).await?;
        self.delete_volume(&src.volume_id).await
    }

    async fn controller_expand_rules(&mut self) -> Check {
        let range = |b: i64| {
            Some(csi::CapacityRange {
                required_bytes: b,
                limit_bytes: 0,
            })
        };
        let req = |id: &str, r: Option<csi::CapacityRange>, s: &HashMap<String, String>| {
            csi::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: r,
                secrets: s.clone(),
                volume_capability: None,
            }
        };
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req("", range(2 * GIB), &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req(
                    FAKE_VOLUME,
                    range(2 * GIB),
                    &self.cfg.secrets,
                )))
                .await,
            Code::NotFound,
            "unknown volume",
        )?;
        let v = self
            .new_volume(
                "cexpand",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req(&v.volume_id, None, &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no capacity range",
        )?;
        let want = v.capacity_bytes + GIB;
        let a = ok(
            self.controller
                .controller_expand_volume(self.req(req(
                    &v.volume_id,
                    range(want),
                    &self.cfg.secrets,
                )))
                .await,
            "expand",
        )?;
        ensure(a.capacity_bytes >= want, || {
            format!("expanded to {} < {want}", a.capacity_bytes)
        })?;
        let b = ok(
            self.controller
                .controller_expand_volume(self.req(req(
                    &v.volume_id,
                    range(want),
                    &self.cfg.secrets,
                )))
                .await,
            "expand again",
        )?;
        ensure(b.capacity_bytes == a.capacity_bytes, || {
            "repeat changed the size".into()
        })?;
        self.delete_volume(&v.volume_id).await
    }

    async fn node_info_rules(&mut self) -> Check {
        let caps = ok(
            self.node
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await,
            "NodeGetCapabilities",
        )?;
        for c in caps.capabilities {
            match c.r#type {
                Some(csi::node_service_capability::Type::Rpc(r))
                    if NRpc::try_from(r.r#type).is_ok_and(|t| t != NRpc::Unknown) => {}
                other => return Err(format!("unknown node capability {other:?}")),
            }
        }
        let info = ok(
            self.node.node_get_info(csi::NodeGetInfoRequest {}).await,
            "NodeGetInfo",
        )?;
        ensure(!info.node_id.is_empty(), || "empty node_id".into())?;
        ensure(info.max_volumes_per_node >= 0, || {
            "negative max_volumes_per_node".into()
        })
    }

    async fn node_bad_args(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let staging = self
            .cfg
            .mount_dir
            .join("bad-args/staging")
            .to_string_lossy()
            .into_owned();
        let target = self
            .cfg
            .mount_dir
            .join("bad-args/target")
            .to_string_lossy()
            .into_owned();
        let stage = |id: &str, path: &str, cap: Option<csi::VolumeCapability>| {
            csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: path.into(),
                volume_capability: cap,
                ..Default::default()
            }
        };
        for (what, req) in [
            (
                "stage: no volume id",
                stage("", &staging, Some(cap.clone())),
            ),
            (
                "stage: no staging path",
                stage(FAKE_VOLUME, "", Some(cap.clone())),
            ),
            ("stage: no capability", stage(FAKE_VOLUME, &staging, None)),
            (
                "stage: relative path",
                stage(FAKE_VOLUME, "relative/path", Some(cap.clone())),
            ),
        ] {
            expect_code(
                self.node.node_stage_volume(self.req(req)).await,
                Code::InvalidArgument,
                what,
            )?;
        }
        let publish =
            |id: &str, t: &str, cap: Option<csi::VolumeCapability>| csi::NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.clone(),
                target_path: t.into(),
                volume_capability: cap,
                ..Default::default()
            };
        let dotdot = format!("{target}/../../../../etc");
        for (what, req) in [
            (
                "publish: no volume id",
                publish("", &target, Some(cap.clone())),
            ),
            (
                "publish: no target path",
                publish(FAKE_VOLUME, "", Some(cap.clone())),
            ),
            (
                "publish: no capability",
                publish(FAKE_VOLUME, &target, None),
            ),
            (
                "publish: path with ..",
                publish(FAKE_VOLUME, &dotdot, Some(cap.clone())),
            ),
        ] {
            expect_code(
                self.node.node_publish_volume(self.req(req)).await,
                Code::InvalidArgument,
                what,
            )?;
        }
        expect_code(
            self.node
                .node_unpublish_volume(self.req(csi::NodeUnpublishVolumeRequest {
                    volume_id: String::new(),
                    target_path: target.clone(),
                }))
                .await,
            Code::InvalidArgument,
            "unpublish: no volume id",
        )?;
        expect_code(
            self.node
                .node_unpublish_volume(self.req(csi::NodeUnpublishVolumeRequest {
                    volume_id: FAKE_VOLUME.into(),
                    target_path: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "unpublish: no target",
        )?;
        expect_code(
            self.node
                .node_unstage_volume(self.req(csi::NodeUnstageVolumeRequest {
                    volume_id: String::new(),
                    staging_target_path: staging.clone(),
                }))
                .await,
            Code::InvalidArgument,
            "unstage: no volume id",
        )?;
        expect_code(
            self.node
                .node_unstage_volume(self.req(csi::NodeUnstageVolumeRequest {
                    volume_id: FAKE_VOLUME.into(),
                    staging_target_path: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "unstage: no staging path",
        )?;
        if self.node_caps.contains(&NRpc::GetVolumeStats) {
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: String::new(),
                        volume_path: target.clone(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::InvalidArgument,
                "stats: no volume id",
            )?;
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: FAKE_VOLUME.into(),
                        volume_path: String::new(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::InvalidArgument,
                "stats: no path",
            )?;
        }
        if self.node_caps.contains(&NRpc::ExpandVolume) {
            expect_code(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: String::new(),
                        volume_path: target.clone(),
                        ..Default::default()
                    }))
                    .await,
                Code::InvalidArgument,
                "expand: no volume id",
            )?;
            expect_code(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: FAKE_VOLUME.into(),
                        volume_path: String::new(),
                        ..Default::default()
                    }))
                    .await,
                Code::InvalidArgument,
                "expand: no path",
            )?;
        }
        Ok(())
    }

    /// A `volume_path` that does not exist, or a relative one, holds no
    /// volume: NotFound (the spec's code), never InvalidArgument, and
    /// nothing is touched.
    async fn node_paths_not_found(&mut self) -> Check {
        let absent = self
            .cfg
            .mount_dir
            .join("never-created")
            .to_string_lossy()
            .into_owned();
        for path in [absent, "some/path".to_string()] {
            if self.node_caps.contains(&NRpc::GetVolumeStats) {
                expect_code(
                    self.node
                        .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                            volume_id: FAKE_VOLUME.into(),
                            volume_path: path.clone(),
                            staging_target_path: String::new(),
                        }))
                        .await,
                    Code::NotFound,
                    &format!("NodeGetVolumeStats of {path:?}"),
                )?;
            }
            if self.node_caps.contains(&NRpc::ExpandVolume) {
                expect_code(
                    self.node
                        .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                            volume_id: FAKE_VOLUME.into(),
                            volume_path: path.clone(),
                            ..Default::default()
                        }))
                        .await,
                    Code::NotFound,
                    &format!("NodeExpandVolume of {path:?}"),
                )?;
            }
        }
        Ok(())
    }

    /// Every volume id ListVolumes returns, page by page.
    async fn listed_volumes(&mut self) -> Result<Vec<String>, String> {
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_volumes(self.req(csi::ListVolumesRequest {
                        max_entries: 100,
                        starting_token: token.clone(),
                    }))
                    .await,
                "ListVolumes",
            )?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if r.next_token.is_empty() {
                return Ok(seen);
            }
            token = r.next_token;
        }
        Err("ListVolumes never ended".into())
    }

    /// A backend deletes asynchronously; the driver answers when the
    /// object is gone, so what a CO does next (list, get, delete the
    /// source) sees it gone.
    async fn deletion_complete(&mut self) -> Check {
        let v = self
            .new_volume("gone", mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        if self.controller_caps.contains(&CRpc::CreateDeleteSnapshot) {
            let s = self.create_snapshot(&v.volume_id).await?;
            self.wait_snapshot_ready(&s.snapshot_id).await?;
            self.delete_snapshot(&s.snapshot_id).await?;
        }
        // at once: its last snapshot is gone
        self.delete_volume(&v.volume_id).await?;
        if self.controller_caps.contains(&CRpc::ListVolumes) {
            let listed = self.listed_volumes().await?;
            ensure(!listed.contains(&v.volume_id), || {
                format!(
                    "volume {} still listed after DeleteVolume answered",
                    v.volume_id
                )
            })?;
        }
        if self.controller_caps.contains(&CRpc::GetVolume) {
            expect_code(
                self.controller
                    .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                        volume_id: v.volume_id.clone(),
                    }))
                    .await,
                Code::NotFound,
                "ControllerGetVolume after DeleteVolume",
            )?;
        }
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: v.volume_id.clone(),
                    volume_capabilities: vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)],
                    secrets: self.cfg.secrets.clone(),
                    ..Default::default()
                }))
                .await,
            Code::NotFound,
            "ValidateVolumeCapabilities after DeleteVolume",
        )
    }

    /// Polls ListSnapshots by id until the snapshot is ready to use, as
    /// the snapshotter does.
    async fn wait_snapshot_ready(&mut self, id: &str) -> Check {
        for _ in 0..600 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        snapshot_id: id.into(),
                        secrets: self.cfg.secrets.clone(),
                        ..Default::default()
                    }))
                    .await,
                "ListSnapshots",
            )?;
            if r.entries
                .iter()
                .any(|e| e.snapshot.as_ref().is_some_and(|s| s.ready_to_use))
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("snapshot {id} not ready after 60 s"))
    }

    async fn get_snapshot_rules(&mut self) -> Check {
        let get = |id: &str, secrets: &HashMap<String, String>| csi::GetSnapshotRequest {
            snapshot_id: id.into(),
            secrets: secrets.clone(),
        };
        expect_code(
            self.controller
                .get_snapshot(self.req(get("", &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .get_snapshot(self.req(get(FAKE_VOLUME, &self.cfg.secrets)))
                .await,
            Code::NotFound,
            "unknown id",
        )?;
        expect_code(
            self.controller
                .get_snapshot(self.req(get("not-a-snapshot-id", &self.cfg.secrets)))
                .await,
            Code::NotFound,
            "malformed id",
        )?;
        let v = self
            .new_volume(
                "getsnap",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let s = self.create_snapshot(&v.volume_id).await?;
        let got = ok(
            self.controller
                .get_snapshot(self.req(get(&s.snapshot_id, &self.cfg.secrets)))
                .await,
            "GetSnapshot",
        )?
        .snapshot
        .ok_or("GetSnapshot returned no snapshot")?;
        ensure(
            got.snapshot_id == s.snapshot_id && got.source_volume_id == v.volume_id,
            || format!("GetSnapshot({}) returned {got:?}", s.snapshot_id),
        )?;
        self.wait_snapshot_ready(&s.snapshot_id).await?;
        self.delete_snapshot(&s.snapshot_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    /// ReadWriteOncePod asks for SINGLE_NODE_SINGLE_WRITER, and a driver
    /// advertising SINGLE_NODE_MULTI_WRITER takes both modes.
    async fn single_node_modes(&mut self) -> Check {
        for mode in [Mode::SingleNodeSingleWriter, Mode::SingleNodeMultiWriter] {
            let cap = mount_cap(&self.cfg.fs_type, mode);
            let v = self.new_volume("rwop", cap.clone()).await?;
            let r = ok(
                self.controller
                    .validate_volume_capabilities(self.req(
                        csi::ValidateVolumeCapabilitiesRequest {
                            volume_id: v.volume_id.clone(),
                            volume_capabilities: vec![cap],
                            secrets: self.cfg.secrets.clone(),
                            ..Default::default()
                        },
                    ))
                    .await,
                "ValidateVolumeCapabilities",
            )?;
            ensure(r.confirmed.is_some(), || {
                format!("{} not confirmed: {}", mode.as_str_name(), r.message)
            })?;
            self.delete_volume(&v.volume_id).await?;
        }
        Ok(())
    }

    /// A snapshot taken with a class's parameters of a volume in use holds
    /// what was written, restores into a new volume, and deletes cleanly.
    async fn snapshot_class_lifecycle(&mut self, class: HashMap<String, String>) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap.clone(), "classsrc").await?;
        std::fs::write(self.seen(&target).join("kept"), b"in the snapshot")
            .map_err(|e| format!("writing to the volume: {e}"))?;
        nix::unistd::sync();
        let req = csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: self.name("classsnap"),
            secrets: self.cfg.secrets.clone(),
            parameters: class,
        };
        let s = ok(
            self.controller.create_snapshot(self.req(req)).await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s.snapshot_id.clone());
        ensure(s.source_volume_id == v.volume_id, || {
            format!(
                "snapshot of {} names source {}",
                v.volume_id, s.source_volume_id
            )
        })?;
        self.wait_snapshot_ready(&s.snapshot_id).await?;
        let restored_name = self.name("classrestored");
        let mut restore = self.create_req(&restored_name, cap.clone(), self.cfg.volume_size);
        restore.volume_content_source = Some(from_snapshot(&s.snapshot_id));
        let restored = self
            .send_create(restore, "CreateVolume from the snapshot")
            .await?;
        let (restored, r_staging, r_target, _) = self.bring_up_volume(restored, cap).await?;
        let data = std::fs::read(self.seen(&r_target).join("kept"))
            .map_err(|e| format!("reading the restored volume: {e}"))?;
        ensure(data == b"in the snapshot", || {
            "the restored volume does not hold what was written".into()
        })?;
        self.tear_down(&restored, &r_staging, &r_target).await?;
        self.delete_snapshot(&s.snapshot_id).await?;
        self.tear_down(&v, &staging, &target).await
    }

    /// Publishing one volume more than the node takes is refused with the
    /// spec's ResourceExhausted, and leaves no attachment behind.
    async fn attach_limit(&mut self) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        let max = self.max_volumes_per_node as usize;
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let mut ids = Vec::new();
        for _ in 0..=max {
            ids.push(self.new_volume("full", cap.clone()).await?.volume_id);
        }
        let result = async {
            for id in &ids[..max] {
                ok(
                    self.controller
                        .controller_publish_volume(self.req(self.publish_req(
                            id,
                            &node,
                            cap.clone(),
                        )))
                        .await,
                    "ControllerPublishVolume within the limit",
                )?;
            }
            expect_code(
                self.controller
                    .controller_publish_volume(self.req(self.publish_req(
                        &ids[max],
                        &node,
                        cap.clone(),
                    )))
                    .await,
                Code::ResourceExhausted,
                "ControllerPublishVolume past max_volumes_per_node",
            )?;
            if self.controller_caps.contains(&CRpc::GetVolume) {
                let r = ok(
                    self.controller
                        .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                            volume_id: ids[max].clone(),
                        }))
                        .await,
                    "ControllerGetVolume",
                )?;
                let nodes = r.status.map(|s| s.published_node_ids).unwrap_or_default();
                ensure(nodes.is_empty(), || {
                    format!("the refused volume is published to {nodes:?}")
                })?;
            }
            Ok::<(), String>(())
        }
        .await;
        for id in &ids {
            let un = csi::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node.clone(),
                secrets: self.cfg.secrets.clone(),
            };
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(un))
                    .await,
                "ControllerUnpublishVolume",
            )?;
        }
        for id in &ids {
            self.delete_volume(id).await?;
        }
        result
    }

    fn lifecycle_paths(&self, id: &str) -> (PathBuf, PathBuf) {
        (
            self.cfg.mount_dir.join(format!("staging/{id}")),
            self.cfg.mount_dir.join(format!("pods/{id}/target")),
        )
    }

    fn publishes(&self) -> bool {
        self.controller_caps.contains(&CRpc::PublishUnpublishVolume)
    }

    /// create → (controller publish) → stage ×2 → publish ×2; returns the
    /// paths.
    async fn bring_up(
        &mut self,
        cap: csi::VolumeCapability,
        what: &str,
    ) -> Result<(csi::Volume, PathBuf, PathBuf, HashMap<String, String>), String> {
        let name = self.name(what);
        let v = self.create_volume(&name, cap.clone()).await?;
        self.bring_up_volume(v, cap).await
    }

    /// (controller publish) → stage ×2 → publish ×2 of an existing volume.
    async fn bring_up_volume(
        &mut self,
        v: csi::Volume,
        cap: csi::VolumeCapability,
    ) -> Result<(csi::Volume, PathBuf, PathBuf, HashMap<String, String>), String> {
        let node = self.node_id.clone().ok_or("no node id")?;
        let pc = if self.publishes() {
            ok(
                self.controller
                    .controller_publish_volume(self.req(self.publish_req(
                        &v.volume_id,
                        &node,
                        cap.clone(),
                    )))
                    .await,
                "ControllerPublishVolume",
            )?
            .publish_context
        } else {
            HashMap::new()
        };
        let (staging, target) = self.lifecycle_paths(&v.volume_id);
        let stage = csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(cap.clone()),
            secrets: self.cfg.secrets.clone(),
            volume_context: v.volume_context.clone(),
        };
        ok(
            self.node.node_stage_volume(self.req(stage.clone())).await,
            "NodeStageVolume",
        )?;
        ok(
            self.node.node_stage_volume(self.req(stage)).await,
            "NodeStageVolume again",
        )?;
        self.node_publish(&v, &pc, &staging, &target, cap, false)
            .await?;
        Ok((v, staging, target, pc))
    }

    /// NodePublishVolume twice (the repeat must succeed).
    async fn node_publish(
        &mut self,
        v: &csi::Volume,
        pc: &HashMap<String, String>,
        staging: &std::path::Path,
        target: &std::path::Path,
        cap: csi::VolumeCapability,
        readonly: bool,
    ) -> Check {
        let publish = csi::NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(cap),
            readonly,
            secrets: self.cfg.secrets.clone(),
            volume_context: v.volume_context.clone(),
        };
        ok(
            self.node
                .node_publish_volume(self.req(publish.clone()))
                .await,
            "NodePublishVolume",
        )?;
        ok(
            self.node.node_publish_volume(self.req(publish)).await,
            "NodePublishVolume again",
        )?;
        Ok(())
    }

    /// NodeUnpublishVolume twice; the target must be gone.
    async fn node_unpublish(&mut self, v: &csi::Volume, target: &std::path::Path) -> Check {
        let un = csi::NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.to_string_lossy().into_owned(),
        };
        ok(
            self.node.node_unpublish_volume(self.req(un.clone())).await,
            "NodeUnpublishVolume",
        )?;
        ok(
            self.node.node_unpublish_volume(self.req(un)).await,
            "NodeUnpublishVolume again",
        )?;
        ensure(!self.mounted(target) && !self.seen(target).exists(), || {
            format!("{} left behind", target.display())
        })
    }

    /// unpublish ×2 → unstage ×2 → (controller unpublish ×2) → delete ×2.
    async fn tear_down(
        &mut self,
        v: &csi::Volume,
        staging: &std::path::Path,
        target: &std::path::Path,
    ) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        self.node_unpublish(v, target).await?;
        let us = csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        ok(
            self.node.node_unstage_volume(self.req(us.clone())).await,
            "NodeUnstageVolume",
        )?;
        ok(
            self.node.node_unstage_volume(self.req(us)).await,
            "NodeUnstageVolume again",
        )?;
        ensure(!self.mounted(staging), || {
            format!("{} still mounted", staging.display())
        })?;
        if self.publishes() {
            let cu = csi::ControllerUnpublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                node_id: node,
                secrets: self.cfg.secrets.clone(),
            };
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(cu.clone()))
                    .await,
                "ControllerUnpublishVolume",
            )?;
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(cu))
                    .await,
                "ControllerUnpublishVolume again",
            )?;
        }
        self.delete_volume(&v.volume_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    async fn lifecycle_mount(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap, "life").await?;
        ensure(self.mounted(&staging), || "staging path not mounted".into())?;
        ensure(self.mounted(&target), || "target path not mounted".into())?;
        std::fs::write(self.seen(&target).join("hello"), b"sanity")
            .map_err(|e| format!("writing to the volume: {e}"))?;
        let seen = std::fs::read(self.seen(&staging).join("hello"))
            .map_err(|e| format!("reading through staging: {e}"))?;
        ensure(seen == b"sanity", || "target and staging disagree".into())?;
        if self.node_caps.contains(&NRpc::GetVolumeStats) {
            let st = ok(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: target.to_string_lossy().into_owned(),
                        staging_target_path: staging.to_string_lossy().into_owned(),
                    }))
                    .await,
                "NodeGetVolumeStats",
            )?;
            let bytes = st
                .usage
                .iter()
                .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
                .ok_or("no byte usage")?;
            ensure(bytes.total > 0 && bytes.used >= 0, || {
                format!("implausible usage {bytes:?}")
            })?;
            if self.cfg.block {
                // a block-backed filesystem is no larger than its volume
                ensure(bytes.total <= v.capacity_bytes && bytes.used > 0, || {
                    format!("implausible usage {bytes:?}")
                })?;
            }
            ensure(
                st.usage
                    .iter()
                    .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32),
                || "no inode usage".into(),
            )?;
            // a volume the node has, asked for at a path it is not at
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: "some/path".into(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::NotFound,
                "NodeGetVolumeStats of a published volume at \"some/path\"",
            )?;
        }
        self.tear_down(&v, &staging, &target).await
    }

    async fn lifecycle_block(&mut self) -> Check {
        let cap = block_cap(Mode::SingleNodeWriter);
        if !self.cfg.block {
            let name = self.name("noblock");
            let req = self.create_req(&name, cap, self.cfg.volume_size);
            return expect_code(
                self.controller.create_volume(self.req(req)).await,
                Code::InvalidArgument,
                "a raw block volume from a driver that serves none",
            );
        }
        let (v, staging, target, _) = self.bring_up(cap, "block").await?;
        let meta = std::fs::metadata(self.seen(&target)).map_err(|e| format!("target: {e}"))?;
        ensure(meta.file_type().is_block_device(), || {
            "target is not a block device".into()
        })?;
        ensure(!self.mounted(&staging), || {
            "a block volume was mounted at staging".into()
        })?;
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(self.seen(&target))
                .map_err(|e| format!("opening the device: {e}"))?;
            let size = f.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
            ensure(size as i64 == v.capacity_bytes, || {
                format!("device is {size} bytes, volume {}", v.capacity_bytes)
            })?;
            f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
            f.write_all(b"raw")
                .map_err(|e| format!("writing the device: {e}"))?;
        }
        self.tear_down(&v, &staging, &target).await
    }

    /// One volume, several publishers: what one writes the other reads; a
    /// read-only publish refuses writes. A driver that shares nothing must
    /// refuse a multi-node mount volume.
    async fn lifecycle_shared(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::MultiNodeMultiWriter);
        if !self.cfg.shared {
            let name = self.name("noshare");
            let req = self.create_req(&name, cap, self.cfg.volume_size);
            return expect_code(
                self.controller.create_volume(self.req(req)).await,
                Code::InvalidArgument,
                "a file system on several nodes from a driver that shares none",
            );
        }
        let (v, staging, a, pc) = self.bring_up(cap.clone(), "shared").await?;
        let b = self
            .cfg
            .mount_dir
            .join(format!("pods/{}/second", v.volume_id));
        let ro = self
            .cfg
            .mount_dir
            .join(format!("pods/{}/reader", v.volume_id));
        self.node_publish(&v, &pc, &staging, &b, cap.clone(), false)
            .await?;
        self.node_publish(&v, &pc, &staging, &ro, cap, true).await?;
        std::fs::write(self.seen(&a).join("shared"), b"one writer")
            .map_err(|e| format!("writing in the first publish: {e}"))?;
        let got = std::fs::read(self.seen(&b).join("shared"))
            .map_err(|e| format!("reading in the second publish: {e}"))?;
        ensure(got == b"one writer", || {
            "the second publisher does not see the first's write".into()
        })?;
        ensure(
            std::fs::write(self.seen(&ro).join("nope"), b"x").is_err(),
            || "a read-only publish accepted a write".into(),
        )?;
        self.node_unpublish(&v, &b).await?;
        self.node_unpublish(&v, &ro).await?;
        self.tear_down(&v, &staging, &a).await
    }

    /// ReadWriteOncePod's guarantee on the node (csi-test #602): a volume
    /// published SINGLE_NODE_SINGLE_WRITER at one target path is refused
    /// at another, and nothing is mounted there; the same path again is
    /// fine. SINGLE_NODE_MULTI_WRITER publishes at several paths.
    async fn single_writer_publish(&mut self) -> Check {
        for (mode, second_allowed) in [
            (Mode::SingleNodeSingleWriter, false),
            (Mode::SingleNodeMultiWriter, true),
        ] {
            let cap = mount_cap(&self.cfg.fs_type, mode);
            let (v, staging, a, pc) = self.bring_up(cap.clone(), "onewriter").await?;
            let b = self
                .cfg
                .mount_dir
                .join(format!("pods/{}/second", v.volume_id));
            let publish = csi::NodePublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                publish_context: pc.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                target_path: b.to_string_lossy().into_owned(),
                volume_capability: Some(cap.clone()),
                readonly: false,
                secrets: self.cfg.secrets.clone(),
                volume_context: v.volume_context.clone(),
            };
            let r = self.node.node_publish_volume(self.req(publish)).await;
            if second_allowed {
                ok(
                    r,
                    "NodePublishVolume at a second path (SINGLE_NODE_MULTI_WRITER)",
                )?;
                self.node_unpublish(&v, &b).await?;
            } else {
                expect_code(
                    r,
                    Code::FailedPrecondition,
                    "NodePublishVolume at a second path of a SINGLE_NODE_SINGLE_WRITER volume",
                )?;
                ensure(!self.mounted(&b), || {
                    format!("{} mounted although refused", b.display())
                })?;
                // the first path again: still fine
                self.node_publish(&v, &pc, &staging, &a, cap.clone(), false)
                    .await?;
            }
            self.tear_down(&v, &staging, &a).await?;
        }
        Ok(())
    }

    async fn lifecycle_expand(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.expansion_fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap.clone(), "grow").await?;
        std::fs::write(self.seen(&target).join("keep"), b"data").map_err(|e| e.to_string())?;
        let want = v.capacity_bytes + GIB;
        let r = ok(
            self.controller
                .controller_expand_volume(self.req(csi::ControllerExpandVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: want,
                        limit_bytes: 0,
                    }),
                    secrets: self.cfg.secrets.clone(),
                    volume_capability: Some(cap.clone()),
                }))
                .await,
            "ControllerExpandVolume",
        )?;
        ensure(r.capacity_bytes >= want, || {
            format!("controller reports {} < {want}", r.capacity_bytes)
        })?;
        let node_expands = self.node_caps.contains(&NRpc::ExpandVolume);
        if node_expands {
            ensure(r.node_expansion_required, || {
                "a filesystem volume needs node expansion".into()
            })?;
            let n = ok(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: target.to_string_lossy().into_owned(),
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: want,
                            limit_bytes: 0,
                        }),
                        staging_target_path: staging.to_string_lossy().into_owned(),
                        volume_capability: Some(cap),
                        secrets: HashMap::new(),
                    }))
                    .await,
                "NodeExpandVolume",
            )?;
            ensure(n.capacity_bytes >= want, || {
                format!("node reports {} < {want}", n.capacity_bytes)
            })?;
        } else {
            ensure(!r.node_expansion_required, || {
                "node expansion required from a node without EXPAND_VOLUME".into()
            })?;
        }
        if node_expands || self.cfg.quota_on_node {
            let mut total = 0;
            // a quota shows on the node's side a moment later
            for _ in 0..50 {
                let st = ok(
                    self.node
                        .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                            volume_id: v.volume_id.clone(),
                            volume_path: target.to_string_lossy().into_owned(),
                            staging_target_path: String::new(),
                        }))
                        .await,
                    "NodeGetVolumeStats",
                )?;
                total = st
                    .usage
                    .iter()
                    .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
                    .map(|u| u.total)
                    .unwrap_or(0);
                if total > v.capacity_bytes {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ensure(total > v.capacity_bytes, || {
                format!(
                    "filesystem is {total} bytes after growing past {}",
                    v.capacity_bytes
                )
            })?;
        }
        let kept = std::fs::read(self.seen(&target).join("keep")).map_err(|e| e.to_string())?;
        ensure(kept == b"data", || "data changed by the expansion".into())?;
        self.tear_down(&v, &staging, &target).await
    }
}
