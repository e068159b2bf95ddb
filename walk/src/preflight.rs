//! A preflight of a real cloud before installing the plugins: what each
//! plugin will ask of it, checked with the plugins' own client library and
//! credentials. Credentials and catalog, quotas, volume and share types, a
//! volume created (attached to a given server and detached) and deleted, a
//! share with an access rule, a Barbican secret readable by the KMS
//! credentials.
//!
//! Every resource it creates carries the name prefix and metadata tag
//! below, is recorded in [`Created`] the moment it exists, and is deleted
//! again by [`Created::delete_all`], which also runs after a failed step
//! and after Ctrl-C. The first failed step stops the preflight; its line
//! names the OpenStack request id and what to check.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::cinder::{BlockStorage, CreateVolume, VolumeStatus};
use openstack_client::common::{Poll, poll_until};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ShareStatus, SharedFileSystems,
};
use openstack_client::nova::Compute;
use openstack_client::service::ServiceType;
use openstack_client::{Error, Session, SessionOptions};
use zeroize::Zeroizing;

use crate::report::say;
use crate::{Options, Report, StepFailure, WalkError, ensure};

/// Metadata key and value on everything the preflight creates.
pub const TAG_KEY: &str = "created-by";
pub const TAG_VALUE: &str = "suite-walk-preflight";

/// What the preflight created and has not deleted yet.
#[derive(Debug, Default)]
pub struct Created {
    session: Option<Session>,
    deadline: Duration,
    items: Vec<Resource>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Resource {
    Volume(String),
    Attachment { server: String, volume: String },
    Share(String),
    Secret(String),
}

impl Created {
    fn add(&mut self, r: Resource) {
        self.items.push(r);
    }

    fn done(&mut self, r: &Resource) {
        self.items.retain(|x| x != r);
    }

    /// Deletes what is left, newest first, each within the wait limit.
    pub async fn delete_all(&mut self, report: &mut Report) {
        let Some(session) = self.session.clone() else {
            return;
        };
        if self.items.is_empty() {
            return;
        }
        report.part("clean-up", "deleting what the preflight created");
        while let Some(r) = self.items.pop() {
            let deadline = Instant::now() + self.deadline;
            let name = match &r {
                Resource::Volume(id) => format!("delete volume {id}"),
                Resource::Attachment { volume, .. } => format!("detach volume {volume}"),
                Resource::Share(id) => format!("delete share {id}"),
                Resource::Secret(id) => format!("delete secret {id}"),
            };
            let s = session.clone();
            report
                .step(&name, async move {
                    match &r {
                        Resource::Volume(id) => {
                            let cinder = BlockStorage::new(s);
                            wait_volume_settled(&cinder, id, deadline).await?;
                            ignore_gone(cinder.delete_volume(id).await)?;
                            wait_gone(deadline, || cinder.get_volume(id)).await?;
                        }
                        Resource::Attachment { server, volume } => {
                            ignore_gone(
                                Compute::new(s.clone()).detach_volume(server, volume).await,
                            )?;
                            wait_volume(
                                &BlockStorage::new(s),
                                volume,
                                VolumeStatus::Available,
                                deadline,
                            )
                            .await?;
                        }
                        Resource::Share(id) => {
                            let manila = SharedFileSystems::new(s);
                            ignore_gone(manila.delete_share(id).await)?;
                            wait_gone(deadline, || manila.get_share(id)).await?;
                        }
                        Resource::Secret(id) => {
                            ignore_gone(KeyManager::new(s).delete_secret(id).await)?;
                        }
                    }
                    Ok(((), "done".into()))
                })
                .await;
        }
    }
}

fn ignore_gone(r: Result<(), Error>) -> Result<(), Error> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

const POLL_FIRST: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(3);

async fn wait_volume(
    cinder: &BlockStorage,
    id: &str,
    want: VolumeStatus,
    deadline: Instant,
) -> Result<(), Error> {
    poll_until("volume_wait", deadline, POLL_FIRST, POLL_MAX, || async {
        let v = cinder.get_volume(id).await?;
        if v.status.is_error() {
            return Err(Error::ResourceFailed {
                operation: "volume_wait",
                id: id.into(),
                status: v.status.to_string(),
                detail: None,
            });
        }
        Ok(if v.status == want {
            Poll::Ready(())
        } else {
            Poll::Pending(v.status.to_string())
        })
    })
    .await
}

/// Waits until a volume is in no transient state (so it can be deleted).
async fn wait_volume_settled(
    cinder: &BlockStorage,
    id: &str,
    deadline: Instant,
) -> Result<(), Error> {
    poll_until("volume_settle", deadline, POLL_FIRST, POLL_MAX, || async {
        Ok(
            match Poll::gone(cinder.get_volume(id).await, |v| v.status.to_string())? {
                // in a transient state (creating, attaching, ...): not yet
                Poll::Pending(s) if s.ends_with("ing") => Poll::Pending(s),
                _ => Poll::Ready(()),
            },
        )
    })
    .await
}

async fn wait_gone<T, F, Fut>(deadline: Instant, get: F) -> Result<(), Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    poll_until("delete_wait", deadline, POLL_FIRST, POLL_MAX, || async {
        Poll::gone(get().await, |_| "still there".into())
    })
    .await
}

/// The session the options name: a clouds.yaml entry, or a cloud.conf.
fn session(options: &Options) -> Result<(Session, CloudConf), WalkError> {
    let conf = match (&options.cloud, &options.cloud_config) {
        (Some(name), _) => CloudConf::from_texts(
            &[(
                PathBuf::from("--cloud"),
                format!("[Global]\nuse-clouds = true\ncloud = \"{name}\"\n"),
            )],
            ConfigEnv::from_process(),
        ),
        (None, Some(path)) => {
            CloudConf::load(std::slice::from_ref(path), ConfigEnv::from_process())
        }
        (None, None) => return Err(WalkError::Config("no cloud named".into())),
    }
    .map_err(|e| WalkError::Config(e.to_string()))?;
    let cloud = conf
        .cloud("")
        .map_err(|e| WalkError::Config(e.to_string()))?;
    let session = Session::new(cloud, SessionOptions::default())
        .map_err(|e| WalkError::Config(e.to_string()))?;
    Ok((session, conf))
}

/// A name no one else uses: the tag and a random suffix.
fn unique_name() -> String {
    let mut b = [0u8; 4];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    format!(
        "{TAG_VALUE}-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

fn tag() -> BTreeMap<String, String> {
    BTreeMap::from([(TAG_KEY.to_string(), TAG_VALUE.to_string())])
}

/// Runs the preflight; stops at the first failed step.
pub async fn run(
    options: &Options,
    report: &mut Report,
    created: &mut Created,
) -> Result<(), WalkError> {
    let (session, conf) = session(options)?;
    created.session = Some(session.clone());
    created.deadline = Duration::from_secs(options.wait_secs);
    let wait = Duration::from_secs(options.wait_secs);
    let name = unique_name();
    say(&format!(
        "suite-walk preflight: what the plugins need of this cloud (resources named {name}, tagged {TAG_KEY}={TAG_VALUE}, deleted at the end)"
    ));

    report.part("cloud", "credentials and service catalog");
    let ok = report
        .step("Keystone: a scoped token", async {
            session.authenticate().await?;
            let user = session.user_id().await?.unwrap_or_default();
            let project = session.project_id().await?.unwrap_or_default();
            Ok(((), format!("user {user}, project {project}")))
        })
        .await;
    if ok.is_none() {
        return Ok(());
    }
    let mut services = Vec::new();
    if options.wants("volume") {
        services.extend([ServiceType::BlockStorage, ServiceType::Compute]);
    }
    if options.wants("share") {
        services.push(ServiceType::SharedFileSystem);
    }
    if options.wants("secrets") {
        services.push(ServiceType::KeyManager);
    }
    for st in services {
        let ok = report
            .step(&format!("catalog: {st}"), async {
                let url = session.endpoint(st).await?;
                Ok(((), url.to_string()))
            })
            .await;
        if ok.is_none() {
            return Ok(());
        }
    }

    if options.wants("volume") && !volume(options, report, created, &session, &name, wait).await {
        return Ok(());
    }
    if options.wants("share") && !share(options, report, created, &session, &name, wait).await {
        return Ok(());
    }
    if options.wants("secrets") {
        secrets(options, report, created, &session, &conf, &name).await;
    }
    Ok(())
}

/// Cinder and Nova, as cinder-csi-plugin uses them. False when a step
/// failed.
async fn volume(
    options: &Options,
    report: &mut Report,
    created: &mut Created,
    session: &Session,
    name: &str,
    wait: Duration,
) -> bool {
    report.part("volume", "Cinder and Nova, as cinder-csi-plugin uses them");
    let cinder = BlockStorage::new(session.clone());
    let ok = report
        .step("Cinder quota", async {
            let l = cinder.absolute_limits().await?;
            let left = |max: i64, used: i64| max < 0 || max - used >= 1;
            ensure(
                left(l.max_total_volumes, l.total_volumes_used)
                    && left(l.max_total_volume_gigabytes, l.total_gigabytes_used),
                || {
                    format!(
                        "no room for a 1 GiB volume: volumes {}/{}, gigabytes {}/{}",
                        l.total_volumes_used,
                        l.max_total_volumes,
                        l.total_gigabytes_used,
                        l.max_total_volume_gigabytes
                    )
                },
            )?;
            Ok((
                (),
                format!(
                    "volumes {}/{}, gigabytes {}/{}, snapshots {}/{} (-1: unlimited)",
                    l.total_volumes_used,
                    l.max_total_volumes,
                    l.total_gigabytes_used,
                    l.max_total_volume_gigabytes,
                    l.total_snapshots_used,
                    l.max_total_snapshots
                ),
            ))
        })
        .await;
    if ok.is_none() {
        return false;
    }
    let ok = report
        .step("volume types", async {
            let types = cinder.list_volume_types().await?;
            let names: Vec<String> = types.iter().map(|t| t.name.clone()).collect();
            if let Some(want) = &options.volume_type {
                ensure(
                    names.iter().any(|n| n == want) || types.iter().any(|t| &t.id == want),
                    || format!("no volume type {want:?}; the cloud has {names:?}"),
                )?;
            }
            Ok(((), names.join(", ")))
        })
        .await;
    if ok.is_none() {
        return false;
    }
    let volume = report
        .step("create a 1 GiB volume", async {
            let started = Instant::now();
            let mut metadata = tag();
            metadata.insert("cinder.csi.openstack.org/cluster".into(), name.into());
            let v = cinder
                .create_volume(&CreateVolume {
                    name: name.into(),
                    size_gib: 1,
                    volume_type: options.volume_type.clone(),
                    metadata,
                    ..Default::default()
                })
                .await?;
            created.add(Resource::Volume(v.id.clone()));
            wait_volume(
                &cinder,
                &v.id,
                VolumeStatus::Available,
                Instant::now() + wait,
            )
            .await?;
            let d = format!(
                "volume {} available after {} ms",
                v.id,
                started.elapsed().as_millis()
            );
            Ok((v.id, d))
        })
        .await;
    let Some(volume) = volume else { return false };
    if let Some(server) = &options.server {
        let nova = Compute::new(session.clone());
        let ok = report
            .step("attach it to the server, detach", async {
                let started = Instant::now();
                let s = nova.get_server(server).await?;
                nova.attach_volume(server, &volume, false).await?;
                let att = Resource::Attachment {
                    server: server.clone(),
                    volume: volume.clone(),
                };
                created.add(att.clone());
                wait_volume(&cinder, &volume, VolumeStatus::InUse, Instant::now() + wait).await?;
                let attached = started.elapsed();
                nova.detach_volume(server, &volume).await?;
                wait_volume(
                    &cinder,
                    &volume,
                    VolumeStatus::Available,
                    Instant::now() + wait,
                )
                .await?;
                created.done(&att);
                Ok((
                    (),
                    format!(
                        "server {} ({}): in-use after {} ms, available again after {} ms",
                        s.name,
                        s.status,
                        attached.as_millis(),
                        started.elapsed().as_millis()
                    ),
                ))
            })
            .await;
        if ok.is_none() {
            return false;
        }
    } else {
        report.skip(
            "attach it to the server, detach",
            "no --server given (the node plugin's server)",
        );
    }
    report
        .step("delete the volume", async {
            cinder.delete_volume(&volume).await?;
            wait_gone(Instant::now() + wait, || cinder.get_volume(&volume)).await?;
            created.done(&Resource::Volume(volume.clone()));
            Ok(((), "gone".into()))
        })
        .await
        .is_some()
}

/// Manila, as manila-csi-plugin uses it. False when a step failed.
async fn share(
    options: &Options,
    report: &mut Report,
    created: &mut Created,
    session: &Session,
    name: &str,
    wait: Duration,
) -> bool {
    report.part("share", "Manila, as manila-csi-plugin uses it");
    let manila = SharedFileSystems::new(session.clone());
    let ok = report
        .step("Manila microversion, quota, share types", async {
            let mv = manila.microversion().await?;
            let limits = manila.share_limits().await?;
            ensure(limits.max_gib.is_none_or(|m| m > limits.used_gib), || {
                format!(
                    "no room for a 1 GiB share: {} of {:?} GiB used",
                    limits.used_gib, limits.max_gib
                )
            })?;
            let types = manila.list_share_types().await?;
            let names: Vec<String> = types.iter().map(|t| t.name.clone()).collect();
            if let Some(want) = &options.share_type {
                ensure(
                    names.iter().any(|n| n == want) || types.iter().any(|t| &t.id == want),
                    || format!("no share type {want:?}; the cloud has {names:?}"),
                )?;
            }
            Ok((
                (),
                format!(
                    "microversion {mv}; {} GiB used of {}; types: {}",
                    limits.used_gib,
                    limits
                        .max_gib
                        .map_or("unlimited".to_string(), |m| m.to_string()),
                    names.join(", ")
                ),
            ))
        })
        .await;
    if ok.is_none() {
        return false;
    }
    let protocol = options.share_protocol.to_ascii_uppercase();
    let share = report
        .step(&format!("create a 1 GiB {protocol} share"), async {
            let started = Instant::now();
            let s = manila
                .create_share(&CreateShare {
                    protocol: protocol.clone(),
                    size_gib: 1,
                    name: name.into(),
                    share_type: options.share_type.clone(),
                    metadata: tag(),
                    ..Default::default()
                })
                .await?;
            created.add(Resource::Share(s.id.clone()));
            poll_until(
                "share_create",
                Instant::now() + wait,
                POLL_FIRST,
                POLL_MAX,
                || async {
                    let now = manila.get_share(&s.id).await?;
                    if now.status.is_error() {
                        let why = manila
                            .list_user_messages(&s.id)
                            .await?
                            .into_iter()
                            .next()
                            .map(|m| m.user_message);
                        return Err(Error::ResourceFailed {
                            operation: "share_create",
                            id: s.id.clone(),
                            status: now.status.to_string(),
                            detail: why,
                        });
                    }
                    Ok(if now.status == ShareStatus::Available {
                        Poll::Ready(())
                    } else {
                        Poll::Pending(now.status.to_string())
                    })
                },
            )
            .await?;
            let d = format!(
                "share {} available after {} ms",
                s.id,
                started.elapsed().as_millis()
            );
            Ok((s.id, d))
        })
        .await;
    let Some(share) = share else { return false };
    let ok = report
        .step("grant access, see it active, revoke", async {
            // a documentation address (RFC 5737) reaches no one; CephFS
            // needs a cephx user, named like the share
            let grant = if protocol == "CEPHFS" {
                GrantAccess {
                    access_type: "cephx".into(),
                    access_to: name.into(),
                    access_level: "rw".into(),
                }
            } else {
                GrantAccess {
                    access_type: "ip".into(),
                    access_to: "192.0.2.1".into(),
                    access_level: "ro".into(),
                }
            };
            let rule = manila.grant_access(&share, &grant).await?;
            poll_until(
                "access_rule",
                Instant::now() + wait,
                POLL_FIRST,
                POLL_MAX,
                || async {
                    let r = manila.get_access_rule(&share, &rule.id).await?;
                    if r.state == AccessRuleState::Error {
                        return Err(Error::ResourceFailed {
                            operation: "access_rule",
                            id: rule.id.clone(),
                            status: r.state.to_string(),
                            detail: None,
                        });
                    }
                    Ok(if r.state == AccessRuleState::Active {
                        Poll::Ready(())
                    } else {
                        Poll::Pending(r.state.to_string())
                    })
                },
            )
            .await?;
            let exports = manila.list_export_locations(&share).await?;
            ensure(!exports.is_empty(), || {
                "the share has no export location".into()
            })?;
            manila.revoke_access(&share, &rule.id).await?;
            wait_gone(Instant::now() + wait, || {
                manila.get_access_rule(&share, &rule.id)
            })
            .await?;
            Ok((
                (),
                format!(
                    "{} rule to {} active; {} export location(s); revoked",
                    grant.access_type,
                    grant.access_to,
                    exports.len()
                ),
            ))
        })
        .await;
    if ok.is_none() {
        return false;
    }
    report
        .step("delete the share", async {
            manila.delete_share(&share).await?;
            wait_gone(Instant::now() + wait, || manila.get_share(&share)).await?;
            created.done(&Resource::Share(share.clone()));
            Ok(((), "gone".into()))
        })
        .await
        .is_some()
}

/// Barbican, as barbican-kms-plugin uses it.
async fn secrets(
    options: &Options,
    report: &mut Report,
    created: &mut Created,
    session: &Session,
    conf: &CloudConf,
    name: &str,
) {
    report.part("secrets", "Barbican, as barbican-kms-plugin uses it");
    let barbican = KeyManager::new(session.clone());
    let configured = options
        .key_id
        .clone()
        .or_else(|| conf.key_manager.key_id.clone());
    match configured {
        Some(key) => {
            report
                .step("read the key-encryption key", async {
                    let meta = barbican.get_secret(&key).await?;
                    let payload = barbican.get_secret_payload(&key).await?;
                    ensure(payload.len() == 32, || {
                        format!(
                            "the secret holds {} bytes; the plugin needs 32 (AES-256)",
                            payload.len()
                        )
                    })?;
                    Ok((
                        (),
                        format!(
                            "secret {key} ({}): 32 bytes, readable",
                            meta.name.unwrap_or_default()
                        ),
                    ))
                })
                .await;
        }
        None => {
            report
                .step("create a secret, read it, delete it", async {
                    let id = barbican
                        .create_secret(&CreateSecret {
                            name: name.into(),
                            payload: Some(Zeroizing::new(vec![0x5a; 32])),
                            algorithm: Some("aes".into()),
                            bit_length: Some(256),
                            mode: Some("gcm".into()),
                            secret_type: "symmetric".into(),
                        })
                        .await?;
                    created.add(Resource::Secret(id.clone()));
                    let payload = barbican.get_secret_payload(&id).await?;
                    ensure(payload.len() == 32, || {
                        format!("read back {} bytes", payload.len())
                    })?;
                    barbican.delete_secret(&id).await?;
                    created.done(&Resource::Secret(id.clone()));
                    Ok((
                        (),
                        "no key-id configured: a test secret was stored, read back and deleted"
                            .into(),
                    ))
                })
                .await;
        }
    }
}

impl From<WalkError> for StepFailure {
    fn from(e: WalkError) -> Self {
        StepFailure::Check(e.to_string())
    }
}
