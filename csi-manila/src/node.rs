//! The CSI Node service: mounts a share once per node at its staging path
//! (ceph-fuse, the kernel's CephFS client, or NFS; see [`crate::mounts`]),
//! binds it into each pod's target path, reports usage and health, and
//! takes everything down again. It asks Manila (with the node-stage
//! secrets) only at NodeStage: for the share, its access rule (the cephx
//! key never travels in a volume context) and its export location.
//!
//! Its records outlive it: a plugin that stops leaves every mount serving,
//! and the next one to start finds them ([`NodeService::repair`] mounts a
//! FUSE share again whose daemon died with the previous plugin).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use csi_common::credentials::Credentials;
use csi_common::node_ops::{
    NodeIdentity, PublishArgs, StageArgs, abnormal_response, bind_staged, blocking, recorded_path,
    remove_mount_point, sanitize_label, single_writer_alone, unpublish_args, unstage_args,
    usage_response, volume_path_arg,
};
use csi_common::request::{Capability, require};
use csi_common::{Context, DriverError, DriverResult, KeyedLocks, csi_node_service};
use host_ops::{MountOptions, Mounter};
use openstack_client::manila::SharedFileSystems;
use proto::csi::v1 as csi;
use proto::csi::v1::node_service_capability::rpc::Type as NodeRpc;

use crate::TOPOLOGY_KEY;
use crate::capabilities::parse_capability;
use crate::daemons::FuseDaemons;
use crate::mount_target::{self, MountTarget};
use crate::mounts::{self, Health};
use crate::parameters::{CephMounter, NodeParameters};
use crate::runtime_config::{Cidr, RuntimeConfigFile};
use crate::share_protocol::ShareProtocol;
use crate::shares::split_export;
use crate::stage_record::{MountKind, StageRecord, StateDir};

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub protocol: ShareProtocol,
    pub with_topology: bool,
    /// Request paths must lie below one of these (the kubelet directory).
    pub path_roots: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct NodeService {
    identity: Arc<RwLock<Option<NodeIdentity>>>,
    credentials: Arc<Credentials<SharedFileSystems>>,
    runtime: Arc<RuntimeConfigFile>,
    state: StateDir,
    daemons: FuseDaemons,
    mounter: Arc<dyn Mounter>,
    opts: NodeOptions,
    locks: KeyedLocks,
}

impl NodeService {
    pub fn new(
        identity: Arc<RwLock<Option<NodeIdentity>>>,
        credentials: Arc<Credentials<SharedFileSystems>>,
        runtime: Arc<RuntimeConfigFile>,
        state: StateDir,
        daemons: FuseDaemons,
        mounter: Arc<dyn Mounter>,
        opts: NodeOptions,
    ) -> Self {
        Self {
            identity,
            credentials,
            runtime,
            state,
            daemons,
            mounter,
            opts,
            locks: KeyedLocks::default(),
        }
    }

    pub fn capabilities() -> Vec<csi::NodeServiceCapability> {
        csi_common::advertise::node(&[
            NodeRpc::StageUnstageVolume,
            NodeRpc::GetVolumeStats,
            NodeRpc::VolumeCondition,
            NodeRpc::SingleNodeMultiWriter,
        ])
    }

    fn mounted(&self, path: &Path) -> DriverResult<bool> {
        Ok(!self
            .mounter
            .mounts_at(path)
            .context("reading mounts")?
            .is_empty())
    }

    /// Whether a staged share answers; a dead one is taken down so that it
    /// can be mounted again.
    async fn staged_and_healthy(&self, rec: &StageRecord) -> DriverResult<bool> {
        if !self.mounted(&rec.staging)? {
            return Ok(false);
        }
        let daemon = self.daemons.of(&self.state, &rec.staging);
        let problem = match mounts::health(&rec.staging).await {
            Health::Answering(_)
                if !rec.mount.is_fuse() || daemon.is_some() || !self.daemons.knows_when_gone() =>
            {
                return Ok(true);
            }
            Health::Answering(_) => "its ceph-fuse daemon is gone".to_string(),
            Health::Broken(e) => e,
            Health::Hung => "it does not answer".to_string(),
        };
        tracing::warn!(volume_id = %rec.volume_id, staging = %rec.staging.display(), %problem, "staged share is broken; mounting it again");
        mounts::unmount_bounded(&rec.staging, daemon.as_ref()).await?;
        if let Some(d) = daemon {
            d.end().await?;
        }
        Ok(false)
    }

    async fn stage(
        &self,
        r: csi::NodeStageVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeStageVolumeResponse> {
        let StageArgs {
            volume_id: id,
            staging,
            capability: cap,
        } = StageArgs::parse(&r, &self.opts.path_roots, parse_capability)?;
        let params = NodeParameters::parse(&r.volume_context)?;
        let _guard = self.locks.lock(&id, deadline).await?;
        self.stage_locked(&id, &staging, &cap, &params, &r.secrets, deadline)
            .await?;
        Ok(csi::NodeStageVolumeResponse {})
    }

    /// NodeStage with the volume's lock held (also NodePublish's, for a
    /// volume staged by another plugin).
    async fn stage_locked(
        &self,
        id: &str,
        staging: &host_ops::Beneath,
        cap: &Capability,
        params: &NodeParameters,
        secrets: &HashMap<String, String>,
        deadline: Instant,
    ) -> DriverResult<()> {
        self.state.ensure()?;

        if let Some(rec) = self.state.load(staging) {
            if rec.volume_id != id {
                return Err(DriverError::FailedPrecondition(format!(
                    "{} is the staging path of volume {}, not {id}",
                    staging.display(),
                    rec.volume_id
                )));
            }
            if self.staged_and_healthy(&rec).await? {
                tracing::info!(volume_id = %id, "already staged");
                return Ok(());
            }
        } else if self.mounted(staging)? {
            self.take_down_foreign_staging(id, staging).await?;
        }

        // what to mount: from the volume context and the rule, else all
        // from Manila (with the node-stage secrets)
        let started = Instant::now();
        let (manila, _) = self.credentials.client_for(secrets)?;
        let manila = manila.with_deadline(deadline);
        let protocol = self.opts.protocol;
        let matching = match (
            protocol,
            self.runtime.current().nfs.match_export_location_address,
        ) {
            (ShareProtocol::Nfs, Some(a)) => Some(Cidr::parse(&a).map_err(|e| {
                DriverError::FailedPrecondition(format!("nfs.matchExportLocationAddress: {e}"))
            })?),
            _ => None,
        };
        let mut target =
            match mount_target::from_context(&manila, id, params, protocol, matching.as_ref())
                .await?
            {
                Some(t) => t,
                None => {
                    mount_target::from_manila(&manila, id, params, protocol, matching.as_ref())
                        .await?
                }
            };
        let mut asked = started.elapsed();
        let mut result = self
            .mount_staged(id, staging, cap, params, &target, deadline)
            .await;
        if result.is_err() && target.from_context {
            // the context may be stale (the export moved): look it all up
            // and mount once more if Manila says something else
            let fresh =
                mount_target::from_manila(&manila, id, params, protocol, matching.as_ref()).await?;
            asked = started.elapsed();
            if fresh.export != target.export || fresh.rule.id != target.rule.id {
                tracing::info!(volume_id = %id, "the volume context's export location is stale; mounting what Manila says");
                target = fresh;
                result = self
                    .mount_staged(id, staging, cap, params, &target, deadline)
                    .await;
            }
        }
        result?;
        tracing::info!(
            volume_id = %id,
            share_id = %target.share_id,
            rule = %target.rule.id,
            from_context = target.from_context,
            staging = %staging.display(),
            manila_ms = asked.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "staged"
        );
        Ok(())
    }

    /// What another plugin mounted at a staging path this plugin has no
    /// record of (upstream's, or the partner plugin it forwarded to:
    /// ceph-csi's ceph-fuse or kernel mount, csi-driver-nfs's NFS mount),
    /// taken down so that the share is mounted this plugin's way. Nothing
    /// is served from it: kubelet names the path for this volume, but
    /// what is mounted there cannot be proven to be its share. The pods'
    /// binds of it keep working (they hold its filesystem). Anything that
    /// is not a mount of this plugin's protocol stays, and is refused.
    async fn take_down_foreign_staging(&self, id: &str, staging: &Path) -> DriverResult<()> {
        let found = self
            .mounter
            .mounts_at(staging)
            .context("reading mounts")?
            .last()
            .map(|m| m.fs_type.clone())
            .unwrap_or_default();
        let ours = match self.opts.protocol {
            ShareProtocol::Cephfs => ["fuse.ceph-fuse", "ceph"].as_slice(),
            ShareProtocol::Nfs => ["nfs", "nfs4"].as_slice(),
        };
        if !ours.contains(&found.as_str()) {
            return Err(DriverError::FailedPrecondition(format!(
                "{} already has a {found} mount that this plugin did not stage (a staging by another plugin is taken over only when it mounts a share: {})",
                staging.display(),
                ours.join(", ")
            )));
        }
        tracing::info!(volume_id = %id, staging = %staging.display(), fs_type = %found, "staged by another plugin; mounting it this plugin's way");
        for _ in 0..8 {
            if !self.mounted(staging)? {
                return Ok(());
            }
            mounts::unmount_bounded(staging, None).await?;
        }
        Err(DriverError::Internal(format!(
            "{} is still mounted",
            staging.display()
        )))
    }

    /// Records and mounts `target` at `staging`; on failure nothing is
    /// left (no mount, daemon or record).
    async fn mount_staged(
        &self,
        id: &str,
        staging: &host_ops::Beneath,
        cap: &csi_common::request::Capability,
        params: &NodeParameters,
        target: &MountTarget,
        deadline: Instant,
    ) -> DriverResult<()> {
        target.check(self.opts.protocol)?;
        let rule = &target.rule;
        if let Some(snapshot) = &params.backing_snapshot
            && rule.access_level != "ro"
        {
            // its controller grants a read-only rule; any other is not
            // this volume's to mount with
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} reads snapshot {snapshot} with a read-only rule; rule {} is {}",
                rule.id, rule.access_level
            )));
        }
        let mount = match self.opts.protocol {
            ShareProtocol::Nfs => MountKind::Nfs {
                export: target.export.clone(),
                options: cap.mount_flags.clone(),
            },
            ShareProtocol::Cephfs => {
                let (monitors, root) = split_export(&target.export)?;
                let (monitors, root) = (monitors.to_string(), root.to_string());
                let fs_name = target.fs_name.clone();
                let client_id = rule.access_to.clone();
                match params.mount.cephfs_mounter {
                    CephMounter::Fuse => MountKind::CephFuse {
                        monitors,
                        root,
                        client_id,
                        fs_name,
                        options: params.mount.cephfs_fuse_mount_options.clone(),
                    },
                    CephMounter::Kernel => MountKind::CephKernel {
                        monitors,
                        root,
                        client_id,
                        fs_name,
                        options: join_options(
                            params.mount.cephfs_kernel_mount_options.as_deref(),
                            &cap.mount_flags,
                        ),
                    },
                }
            }
        };
        let rec = StageRecord {
            volume_id: id.to_string(),
            share_id: target.share_id.clone(),
            staging: staging.to_path_buf(),
            mount,
            targets: Vec::new(),
            read_only_targets: Vec::new(),
            backing_snapshot: params.backing_snapshot.clone(),
        };
        // recorded before mounting: a crash in between leaves what
        // cleanup needs
        self.state.save(&rec)?;
        staging
            .create_dir()
            .context(format!("creating {staging}"))?;
        if let Err(e) = mounts::mount(
            &self.state,
            &self.daemons,
            &*self.mounter,
            &rec,
            rule.access_key.as_deref(),
            deadline,
        )
        .await
        {
            let daemon = self.daemons.of(&self.state, staging);
            let _ = mounts::unmount_bounded(staging, daemon.as_ref()).await;
            if let Some(d) = daemon {
                let _ = d.end().await;
            }
            let _ = self.state.remove(staging);
            return Err(e);
        }
        Ok(())
    }

    /// Mounts a recorded share again (its FUSE daemon died, the cluster
    /// was away): the record holds everything, the key included. True
    /// when it had to.
    async fn restage(&self, rec: &StageRecord, deadline: Instant) -> DriverResult<bool> {
        if self.staged_and_healthy(rec).await? {
            return Ok(false);
        }
        mounts::mount(
            &self.state,
            &self.daemons,
            &*self.mounter,
            rec,
            None,
            deadline,
        )
        .await?;
        tracing::info!(volume_id = %rec.volume_id, staging = %rec.staging.display(), "staged share mounted again");
        Ok(true)
    }

    async fn unstage(
        &self,
        r: csi::NodeUnstageVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeUnstageVolumeResponse> {
        let (id, staging) = unstage_args(&r, &self.opts.path_roots)?;
        let _guard = self.locks.lock(&id, deadline).await?;
        let daemon = self.daemons.of(&self.state, &staging);
        for _ in 0..8 {
            if !self.mounted(&staging)? {
                break;
            }
            mounts::unmount_bounded(&staging, daemon.as_ref()).await?;
        }
        if self.mounted(&staging)? {
            return Err(DriverError::Internal(format!(
                "{} is still mounted",
                staging.display()
            )));
        }
        // the daemon ends with its mount; a mount pod is deleted (a
        // failure keeps the record, so that the retry deletes it)
        if let Some(d) = daemon {
            d.end().await?;
        }
        self.state.remove(&staging)?;
        let s = staging.clone();
        blocking(move || remove_mount_point(&s)).await?;
        tracing::info!(volume_id = %id, staging = %staging.display(), "unstaged");
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    async fn publish(
        &self,
        r: csi::NodePublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodePublishVolumeResponse> {
        let args = PublishArgs::parse(&r, &self.opts.path_roots, parse_capability)?;
        let (id, staging, target) = (
            args.volume_id.clone(),
            args.staging.clone(),
            args.target.clone(),
        );
        let read_only = args.read_only;
        let _guard = self.locks.lock(&id, deadline).await?;
        if self.state.load(&staging).is_none() && staging.is_dir() {
            // kubelet staged it through another plugin (upstream's, whose
            // NFS partner stages nothing, or ceph-csi's mount), and, as
            // the volume stays staged for kubelet, asks this one only to
            // publish: staged now, this plugin's way, with the publish
            // secrets (upstream's classes name both)
            let params = NodeParameters::parse(&r.volume_context)?;
            tracing::info!(volume_id = %id, staging = %staging.display(), "published before this plugin staged it; staging it first");
            self.stage_locked(
                &id,
                &staging,
                &args.capability,
                &params,
                &r.secrets,
                deadline,
            )
            .await?;
        }
        let Some(mut rec) = self.state.load(&staging) else {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is not staged at {}",
                staging.display()
            )));
        };
        if rec.volume_id != id {
            return Err(DriverError::FailedPrecondition(format!(
                "{} is the staging path of volume {}, not {id}",
                staging.display(),
                rec.volume_id
            )));
        }
        self.restage(&rec, deadline).await?;
        let elsewhere: Vec<PathBuf> = rec
            .targets
            .iter()
            .filter(|t| self.mounted(t).unwrap_or(false))
            .cloned()
            .collect();
        single_writer_alone(&id, &args.capability, &target, &elsewhere)?;
        if let Some(existing) = self
            .mounter
            .mounts_at(&target)
            .context("reading mounts")?
            .last()
            && !rec.targets.iter().any(|t| t == target.path())
            && existing.fs_type.starts_with("fuse")
        {
            // a bind of a FUSE mount that died with its daemon
            if matches!(
                mounts::health(&target).await,
                Health::Broken(_) | Health::Hung
            ) {
                mounts::unmount_bounded(&target, None).await?;
            }
        }
        // a volume backed by a snapshot is read-only wherever it goes
        let read_only = read_only || rec.backing_snapshot.is_some();
        let mounter = self.mounter.clone();
        let (s, t) = (staging.clone(), target.clone());
        let (backing, roots) = (rec.backing_snapshot.clone(), self.opts.path_roots.clone());
        blocking(move || bind_target(&*mounter, backing.as_deref(), &roots, &s, &t, read_only))
            .await?;
        if !rec.targets.iter().any(|t| t == target.path()) {
            rec.targets.push(target.to_path_buf());
            if read_only {
                rec.read_only_targets.push(target.to_path_buf());
            }
            self.state.save(&rec)?;
        }
        tracing::info!(volume_id = %id, target = %target.display(), read_only, "published");
        Ok(csi::NodePublishVolumeResponse {})
    }

    async fn unpublish(
        &self,
        r: csi::NodeUnpublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeUnpublishVolumeResponse> {
        let (id, target) = unpublish_args(&r, &self.opts.path_roots)?;
        let _guard = self.locks.lock(&id, deadline).await?;
        let rec = self.state.for_target(&target);
        let daemon = rec
            .as_ref()
            .and_then(|r| self.daemons.of(&self.state, &r.staging));
        for _ in 0..8 {
            if !self.mounted(&target)? {
                break;
            }
            mounts::unmount_bounded(&target, daemon.as_ref()).await?;
        }
        if self.mounted(&target)? {
            return Err(DriverError::Internal(format!(
                "{} is still mounted",
                target.display()
            )));
        }
        let t = target.clone();
        blocking(move || remove_mount_point(&t)).await?;
        if let Some(mut rec) = rec {
            rec.targets.retain(|t| t != target.path());
            rec.read_only_targets.retain(|t| t != target.path());
            self.state.save(&rec)?;
        }
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    async fn stats(
        &self,
        r: csi::NodeGetVolumeStatsRequest,
        _deadline: Instant,
    ) -> DriverResult<csi::NodeGetVolumeStatsResponse> {
        require(&r.volume_id, "volume_id")?;
        let path = volume_path_arg(&r.volume_path, &self.opts.path_roots)?;
        if !self.mounted(&path)? {
            return Err(DriverError::NotFound(format!(
                "no volume is mounted at {}",
                path.display()
            )));
        }
        let fuse_dead = self.daemons.knows_when_gone()
            && self
                .state
                .for_target(&path)
                .or_else(|| self.state.load(&path))
                .filter(|rec| rec.mount.is_fuse())
                .is_some_and(|rec| self.daemons.of(&self.state, &rec.staging).is_none());
        Ok(match mounts::health(&path).await {
            _ if fuse_dead => abnormal_response(
                "the ceph-fuse daemon of this mount is gone; the next NodeStage or NodePublish mounts it again".into(),
            ),
            Health::Answering(u) => usage_response(&u, "share mounted and answering"),
            Health::Broken(e) => abnormal_response(format!("the share does not answer: {e}")),
            Health::Hung => abnormal_response(format!(
                "the share did not answer within {:?} (cluster unreachable, or this client evicted)",
                mounts::HEALTH_TIMEOUT
            )),
        })
    }

    async fn node_info(&self) -> DriverResult<csi::NodeGetInfoResponse> {
        let identity = self
            .identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                DriverError::Unavailable("instance metadata has not been read yet".into())
            })?;
        let accessible_topology = self.opts.with_topology.then(|| csi::Topology {
            segments: HashMap::from([(
                TOPOLOGY_KEY.to_string(),
                sanitize_label(&identity.availability_zone),
            )]),
        });
        Ok(csi::NodeGetInfoResponse {
            node_id: identity.instance_id,
            // shares are not attached: no per-node limit
            max_volumes_per_node: 0,
            accessible_topology,
        })
    }

    /// At start: every FUSE share staged before is checked, and one whose
    /// daemon is gone (it died with the previous plugin's container) is
    /// mounted again from its record, with the binds of its pods. A pod's
    /// running containers keep the mount they started with; those that
    /// restart (and new ones) get the repaired mount. With mount pods, a
    /// daemon only goes with its pod (deleted, or killed out of memory),
    /// and mount pods no record names are ended.
    pub async fn repair(&self) {
        let records = self.state.all();
        if let FuseDaemons::Pods(pods) = &self.daemons {
            self.end_orphan_mount_pods(pods, &records).await;
        }
        let mut repaired = 0;
        for rec in records.into_iter().filter(|r| r.mount.is_fuse()) {
            let deadline = Instant::now() + std::time::Duration::from_secs(120);
            let Ok(_guard) = self.locks.lock(&rec.volume_id, deadline).await else {
                continue;
            };
            // the record may have gone while waiting for the lock
            let Some(rec) = self.state.load(&rec.staging) else {
                continue;
            };
            match self.repair_one(&rec, deadline).await {
                Ok(true) => repaired += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(volume_id = %rec.volume_id, error = %e, "could not repair the staged share; the next NodeStage or NodePublish tries again")
                }
            }
        }
        tracing::info!(repaired, "staged shares checked");
    }

    /// Mounts one recorded share and its binds again where they are dead;
    /// true when something was repaired.
    async fn repair_one(&self, rec: &StageRecord, deadline: Instant) -> DriverResult<bool> {
        let mut repaired = self.restage(rec, deadline).await?;
        for target in &rec.targets {
            if !target.exists() {
                continue;
            }
            let bound = self.mounted(target)?;
            if bound && matches!(mounts::health(target).await, Health::Answering(_)) {
                continue;
            }
            if bound {
                mounts::unmount_bounded(target, None).await?;
            }
            let read_only = rec.read_only_targets.contains(target);
            let mounter = self.mounter.clone();
            let s = recorded_path(&rec.staging, &self.opts.path_roots)?;
            let t = recorded_path(target, &self.opts.path_roots)?;
            let (backing, roots) = (rec.backing_snapshot.clone(), self.opts.path_roots.clone());
            blocking(move || bind_target(&*mounter, backing.as_deref(), &roots, &s, &t, read_only))
                .await?;
            repaired = true;
            tracing::info!(volume_id = %rec.volume_id, target = %target.display(), read_only, "published share bound again");
        }
        Ok(repaired)
    }

    /// Mount pods of this node that no record names (their unstage did
    /// not finish): ended, unless something is still mounted at their
    /// staging path.
    async fn end_orphan_mount_pods(
        &self,
        pods: &crate::mount_pods::MountPods,
        records: &[StageRecord],
    ) {
        let found = match pods.on_this_node().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list this node's mount pods");
                return;
            }
        };
        for pod in found {
            let staging = pod
                .metadata
                .annotations
                .get(crate::mount_pods::STAGING_ANNOTATION)
                .map(PathBuf::from);
            let recorded = staging
                .as_ref()
                .is_some_and(|s| records.iter().any(|r| &r.staging == s));
            if recorded {
                continue;
            }
            if let Some(s) = &staging
                && self.mounted(s).unwrap_or(true)
            {
                tracing::warn!(pod = %pod.metadata.name, staging = %s.display(), "mount pod without a record still has its share mounted; left alone");
                continue;
            }
            let deadline = Instant::now() + std::time::Duration::from_secs(30);
            match pods.end(&pod.metadata.name, None, deadline).await {
                Ok(()) => {
                    tracing::info!(pod = %pod.metadata.name, "mount pod without a record ended")
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.metadata.name, error = %e, "cannot end a mount pod without a record")
                }
            }
        }
    }
}

/// The StorageClass's kernel mount options and the capability's mount
/// flags, as one `-o` list.
/// Binds what a staged volume publishes at a target: the share, or for a
/// volume backed by a snapshot the snapshot's directory in it, read-only.
fn bind_target(
    mounter: &dyn Mounter,
    backing_snapshot: Option<&str>,
    roots: &[PathBuf],
    staging: &host_ops::Beneath,
    target: &host_ops::Beneath,
    read_only: bool,
) -> DriverResult<()> {
    match backing_snapshot {
        None => bind_staged(
            mounter,
            staging,
            target,
            read_only,
            &MountOptions::default(),
        ),
        Some(snapshot) => {
            let source = crate::snapshot_dir::find(staging, roots, snapshot)?;
            crate::snapshot_dir::bind(mounter, staging, &source, target)
        }
    }
}

fn join_options(sc: Option<&str>, flags: &[String]) -> Option<String> {
    let all: Vec<&str> = sc
        .into_iter()
        .chain(flags.iter().map(String::as_str))
        .filter(|s| !s.is_empty())
        .collect();
    (!all.is_empty()).then(|| all.join(","))
}

csi_node_service!(NodeService {
    unimplemented node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse
        = "a share's size is its quota: ControllerExpandVolume is all it needs";
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_join() {
        assert_eq!(
            join_options(Some("noatime"), &["ro".to_string()]).as_deref(),
            Some("noatime,ro")
        );
        assert_eq!(join_options(None, &[]), None);
    }
}
