//! `manila-csi-plugin` (NFS) against the real test cloud: real Keystone,
//! real Manila with its CephFS driver exporting subvolumes of a real Ceph
//! through NFS-Ganesha. Start the cloud with `python3
//! tests/openstack/cloud.py up file` (or `all`), then
//! `OPENSTACK_TEST_BACKEND=real cargo test -p csi-manila --test
//! real_cloud_nfs -- --ignored`.
//!
//! The server is asked through a userspace NFSv4.0 client (libnfs's
//! `nfs-ls`, `nfs-cp`, `nfs-cat`), as 127.0.0.1 directly and as
//! 127.0.0.2 through a relay whose connections leave from that address
//! (libnfs has no source-address option). This machine has no kernel NFS
//! client: the node's `mount -t nfs` goes to a stand-in helper that asks
//! the server for the export before it binds a local directory, so the
//! node is proven up to the mount(8) boundary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use openstack_client::manila::{AccessRuleState, GrantAccess};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;

mod real_common;
use real_common::*;

/// NFS-Ganesha of the test cloud (`cloud.py`'s `nfs` port).
const NFS_SERVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 2049);
/// The address no rule of these tests admits (unless one says so).
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

const NFS_TYPE: (&str, &str) = ("type", "cephfs-nfs");
const THIS_NODE: (&str, &str) = ("nfs-shareClient", "127.0.0.1/32");

/// How a libnfs call reaches the server.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// From 127.0.0.1, as the node.
    Node,
    /// Through a relay whose connections leave from its address.
    Relayed(u16),
}

/// A TCP relay to Ganesha on 127.0.0.1 whose outgoing connections leave
/// from `source`: to the server, another client.
struct Relay {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn from(source: Ipv4Addr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind(SocketAddr::new(source.into(), 0)).unwrap();
                    if let Ok(mut outbound) = socket.connect(NFS_SERVER).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Relay { port, task }
    }

    fn client(&self) -> Client {
        Client::Relayed(self.port)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `nfs://server/path/file?version=4`, reaching the server as `client`.
fn nfs_url(export: &str, file: &str, client: Client) -> String {
    let (server, path) = export.split_once(":/").expect("host:/path export");
    let file = if file.is_empty() {
        String::new()
    } else {
        format!("/{file}")
    };
    // the relay listens on 127.0.0.1 at a port of its own
    let (server, port) = match client {
        Client::Node => (server, String::new()),
        Client::Relayed(p) => ("127.0.0.1", format!("&nfsport={p}")),
    };
    format!("nfs://{server}/{path}{file}?version=4{port}")
}

/// A libnfs tool, bounded: its stdout, or what it said when it failed.
async fn libnfs(tool: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(tool)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("{tool} {args:?}: no answer in 30 s"))?
    .unwrap_or_else(|e| panic!("{tool}: {e} (libnfs-utils is installed by cloud.py)"));
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{tool} {args:?}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

async fn nfs_list(export: &str, client: Client) -> Result<Vec<String>, String> {
    let out = libnfs("nfs-ls", &[&nfs_url(export, "", client)]).await?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect())
}

async fn nfs_write(export: &str, file: &str, data: &[u8], client: Client) -> Result<(), String> {
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), data).unwrap();
    libnfs(
        "nfs-cp",
        &[
            &local.path().to_string_lossy(),
            &nfs_url(export, file, client),
        ],
    )
    .await
    .map(|_| ())
}

async fn nfs_read(export: &str, file: &str, client: Client) -> Result<Vec<u8>, String> {
    libnfs("nfs-cat", &[&nfs_url(export, file, client)]).await
}

/// A file of the CephFS behind Ganesha, read as Ceph's admin through
/// libcephfs (Debian's python3-cephfs, installed with Ceph by cloud.py).
fn cephfs_read(path: &str) -> Result<Vec<u8>, String> {
    let conf = cloud_dir().join("ceph/ceph.conf");
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import cephfs, sys\n\
             fs = cephfs.LibCephFS(conffile=sys.argv[1]); fs.mount()\n\
             fd = fs.open(sys.argv[2].encode(), 'r')\n\
             sys.stdout.buffer.write(fs.read(fd, 0, 1 << 20))\n\
             fs.close(fd); fs.unmount(); fs.shutdown()\n",
        ])
        .arg(conf)
        .arg(path)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The exports Ganesha serves now (its D-Bus ShowExports), as text.
fn ganesha_exports() -> String {
    let out = std::process::Command::new("dbus-send")
        .args([
            "--system",
            "--print-reply",
            "--dest=org.ganesha.nfsd",
            "/org/ganesha/nfsd/ExportMgr",
            "org.ganesha.nfsd.exportmgr.ShowExports",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ShowExports: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The export configuration Manila keeps for Ganesha, every file's text.
fn ganesha_export_files() -> String {
    std::fs::read_dir(cloud_dir().join("ganesha/export.d"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| {
            format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                std::fs::read_to_string(e.path()).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_rule_active(e: &Env, share: &str, rule: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let r = e.manila.get_access_rule(share, rule).await.unwrap();
        if r.state == AccessRuleState::Active {
            return;
        }
        assert!(
            Instant::now() < until && r.state != AccessRuleState::Error,
            "rule {rule}: {:?}",
            r.state
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The share's only export location.
async fn export_of(e: &Env, share: &str) -> String {
    let el = e.manila.list_export_locations(share).await.unwrap();
    assert_eq!(el.len(), 1, "{el:?}");
    el[0].path.clone()
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn an_nfs_share_answers_only_the_clients_its_rules_name() {
    let _serial = SERIAL.lock().await;
    let mut e = env("NFS", &[NFS_TYPE, THIS_NODE]).await;
    let v = e.create(&unique("nfs-rules"), 1, None).await;
    let id = v.volume_id.clone();
    let export = export_of(&e, &id).await;
    assert!(export.starts_with("127.0.0.1:/volumes/"), "{export}");

    // the client the StorageClass names reads and writes
    nfs_write(&export, "from-node", b"written over NFS", Client::Node)
        .await
        .unwrap();
    assert_eq!(
        nfs_read(&export, "from-node", Client::Node).await.unwrap(),
        b"written over NFS"
    );
    // the relay itself is no obstacle: from 127.0.0.1 it passes
    let same = Relay::from(Ipv4Addr::LOCALHOST).await;
    assert!(
        nfs_list(&export, same.client())
            .await
            .unwrap()
            .contains(&"from-node".to_string())
    );
    // another address is refused: no listing, no read, no write
    let other = Relay::from(OTHER_CLIENT).await;
    assert!(nfs_list(&export, other.client()).await.is_err());
    assert!(
        nfs_read(&export, "from-node", other.client())
            .await
            .is_err()
    );
    assert!(
        nfs_write(&export, "intruder", b"x", other.client())
            .await
            .is_err()
    );

    // an `ro` rule for it: it reads, and its writes are refused
    let rule = e
        .manila
        .grant_access(
            &id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: OTHER_CLIENT.to_string(),
                access_level: "ro".into(),
            },
        )
        .await
        .unwrap();
    wait_rule_active(&e, &id, &rule.id).await;
    assert_eq!(
        nfs_read(&export, "from-node", other.client())
            .await
            .unwrap(),
        b"written over NFS"
    );
    let refused = nfs_write(&export, "intruder", b"x", other.client()).await;
    assert!(refused.is_err(), "an ro client wrote");
    assert!(
        !nfs_list(&export, Client::Node)
            .await
            .unwrap()
            .contains(&"intruder".to_string())
    );
    // and the node still writes
    nfs_write(&export, "again", b"rw still", Client::Node)
        .await
        .unwrap();
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn the_node_mounts_the_export_the_server_serves() {
    let _serial = SERIAL.lock().await;
    let mut e = env("NFS", &[NFS_TYPE, THIS_NODE]).await;
    let v = e.create(&unique("nfs-node"), 1, None).await;
    let id = v.volume_id.clone();
    let export = export_of(&e, &id).await;

    let staging = e.stage(&id, &v.volume_context).await;
    let calls: Vec<_> =
        e.h.helper_calls()
            .into_iter()
            .filter(|c| c.program == "nfs")
            .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].source, export, "the node mounts Manila's export");
    assert_eq!(Path::new(&calls[0].target), staging);

    // what is written to the path the node mounted lands in the share's
    // subvolume on Ceph, and reads back over NFS
    nfs_write(
        &calls[0].source,
        "via-node-export",
        b"one share",
        Client::Node,
    )
    .await
    .unwrap();
    let subvolume = export.split_once(':').unwrap().1;
    assert_eq!(
        cephfs_read(&format!("{subvolume}/via-node-export")).unwrap(),
        b"one share"
    );
    assert_eq!(
        nfs_read(&export, "via-node-export", Client::Node)
            .await
            .unwrap(),
        b"one share"
    );
    e.unstage(&id).await.unwrap();

    // a share whose rule names another client: the server refuses this
    // node, and so does the stage (nothing is mounted, the error says why)
    let mut other = env("NFS", &[NFS_TYPE, ("nfs-shareClient", "127.0.0.2/32")]).await;
    let w = other.create(&unique("nfs-elsewhere"), 1, None).await;
    let (staging, _) = other.h.paths(&w.volume_id, "pod-a");
    let refused = other
        .n
        .node_stage_volume(timed(csi::NodeStageVolumeRequest {
            volume_id: w.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
            secrets: other.h.secrets.clone(),
            volume_context: w.volume_context.clone(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("access denied by server"),
        "{refused:?}"
    );
    assert!(
        other
            .h
            .helper_calls()
            .iter()
            .all(|c| c.target != staging.to_string_lossy()),
        "nothing recorded as mounted"
    );
    other.delete(&w.volume_id).await;
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn delete_revokes_the_rule_first_and_leaves_nothing_behind() {
    let _serial = SERIAL.lock().await;
    let mut e = env("NFS", &[NFS_TYPE, THIS_NODE]).await;
    let v = e.create(&unique("nfs-delete"), 1, None).await;
    let id = v.volume_id.clone();
    let export = export_of(&e, &id).await;
    let subvolume = export.split_once(':').unwrap().1.to_string();
    // the subvolume's name is the share instance's id
    let instance = subvolume.split('/').nth(3).unwrap().to_string();
    nfs_write(&export, "doomed", b"x", Client::Node)
        .await
        .unwrap();
    assert!(ganesha_exports().contains(&subvolume));

    // watch the export and the share while DeleteVolume runs: each sample
    // asks Manila first, then the server
    let watcher = {
        let manila = e.manila.clone();
        let export = export.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let until = Instant::now() + Duration::from_secs(120);
            while Instant::now() < until {
                let share = match manila.get_share(&id).await {
                    Ok(s) => s.status.as_str().to_string(),
                    Err(err) if err.is_not_found() => "gone".to_string(),
                    Err(err) => panic!("GET share: {err}"),
                };
                let answers = nfs_list(&export, Client::Node).await.is_ok();
                samples.push((share.clone(), answers));
                if share == "gone" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    e.delete(&id).await;
    let samples = watcher.await.unwrap();
    assert_eq!(samples.last().unwrap().0, "gone", "{samples:?}");
    assert!(
        samples
            .iter()
            .all(|(share, answers)| share == "available" || !answers),
        "the export answered once the share was being deleted: {samples:?}"
    );
    assert!(
        samples
            .iter()
            .any(|(share, answers)| share == "available" && !answers),
        "the export never stopped answering before the share's deletion began: {samples:?}"
    );

    // nothing left: no export served or configured, no cephx user of
    // Ganesha's, no subvolume, no share
    assert!(!ganesha_exports().contains(&subvolume));
    assert!(!ganesha_export_files().contains(&instance));
    let users = ceph(&["auth", "ls"]);
    assert!(!String::from_utf8_lossy(&users.stdout).contains(&format!("ganesha-{instance}")));
    let subvolumes = ceph(&["fs", "subvolume", "ls", "cephfs"]);
    assert!(!String::from_utf8_lossy(&subvolumes.stdout).contains(&instance));
    assert!(cephfs_read(&format!("{subvolume}/doomed")).is_err());
    assert!(e.manila.get_share(&id).await.unwrap_err().is_not_found());
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn snapshot_restore_clone_and_growth_of_an_nfs_share() {
    let _serial = SERIAL.lock().await;
    let mut e = env("NFS", &[NFS_TYPE, THIS_NODE]).await;
    let v = e.create(&unique("nfs-data"), 1, None).await;
    let id = v.volume_id.clone();
    let export = export_of(&e, &id).await;
    nfs_write(&export, "kept", b"before the snapshot", Client::Node)
        .await
        .unwrap();

    let snap = e.snapshot(&id, &unique("nfs-snap")).await;
    assert!(snap.ready_to_use, "CreateSnapshot waits for Manila");
    // written after the snapshot: neither the restore nor the snapshot has it
    nfs_write(&export, "later", b"after", Client::Node)
        .await
        .unwrap();

    let restored = e
        .create(&unique("nfs-restored"), 1, of_snapshot(&snap.snapshot_id))
        .await;
    let restored_export = export_of(&e, &restored.volume_id).await;
    assert_ne!(restored_export, export);
    assert_eq!(
        nfs_read(&restored_export, "kept", Client::Node)
            .await
            .unwrap(),
        b"before the snapshot"
    );
    assert!(
        !nfs_list(&restored_export, Client::Node)
            .await
            .unwrap()
            .contains(&"later".to_string())
    );
    // the restored share has its own rule: it refuses other clients too
    let other = Relay::from(OTHER_CLIENT).await;
    assert!(nfs_list(&restored_export, other.client()).await.is_err());
    nfs_write(
        &restored_export,
        "own",
        b"the copy is writable",
        Client::Node,
    )
    .await
    .unwrap();
    assert!(
        !nfs_list(&export, Client::Node)
            .await
            .unwrap()
            .contains(&"own".to_string())
    );

    // restored for readers only (ReadOnlyMany): the server refuses writes
    let for_readers = e
        .create_as(
            &unique("nfs-readers"),
            1,
            of_snapshot(&snap.snapshot_id),
            Mode::MultiNodeReaderOnly,
        )
        .await;
    let readers_export = export_of(&e, &for_readers.volume_id).await;
    assert_eq!(
        nfs_read(&readers_export, "kept", Client::Node)
            .await
            .unwrap(),
        b"before the snapshot"
    );
    assert!(
        nfs_write(&readers_export, "scribble", b"x", Client::Node)
            .await
            .is_err(),
        "a ReadOnlyMany share took a write"
    );

    let clone = e.create(&unique("nfs-clone"), 1, of_volume(&id)).await;
    let clone_export = export_of(&e, &clone.volume_id).await;
    assert_eq!(
        nfs_read(&clone_export, "later", Client::Node)
            .await
            .unwrap(),
        b"after"
    );

    // growth: the subvolume's quota follows, and the share still answers
    let grown = e.expand(&id, 2).await;
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    assert!(!grown.node_expansion_required);
    let instance = export.split('/').nth(3).unwrap();
    let info = ceph(&[
        "fs",
        "subvolume",
        "info",
        "cephfs",
        instance,
        "--format",
        "json",
    ]);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&info.stderr)));
    assert_eq!(info["bytes_quota"], 2 * GIB, "{info}");
    assert_eq!(
        nfs_read(&export, "kept", Client::Node).await.unwrap(),
        b"before the snapshot"
    );

    for vol in [
        &clone.volume_id,
        &for_readers.volume_id,
        &restored.volume_id,
    ] {
        e.delete(vol).await;
    }
    e.delete_snapshot(&snap.snapshot_id).await;
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn the_orphan_report_keeps_a_real_share_granted_to_a_node_of_the_cluster() {
    use csi_sanity::harness::kube::StandInApiserver;
    let _serial = SERIAL.lock().await;
    let api = StandInApiserver::start().await.unwrap();
    // this machine is the cluster's one node, at 127.0.0.1
    api.objects().nodes = vec![("this-node".into(), vec!["127.0.0.1".into()])];
    let mut e = env_with_args("NFS", &[NFS_TYPE, THIS_NODE], &api.flags()).await;
    let named = e
        .create(&unique("orphan-nfs-named"), 1, None)
        .await
        .volume_id;
    let to_node = e
        .create(&unique("orphan-nfs-node"), 1, None)
        .await
        .volume_id;
    e.parameters
        .insert("nfs-shareClient".into(), format!("{OTHER_CLIENT}/32"));
    let to_other = e
        .create(&unique("orphan-nfs-other"), 1, None)
        .await
        .volume_id;
    api.objects().pvs = vec![("nfs.manila.csi.openstack.org".into(), named.clone())];
    let report = api
        .orphan_report(
            Path::new(BIN),
            &cloud_dir().join("cloud-member.conf"),
            &[
                "--cluster-id=sanity-real",
                "--drivername=nfs.manila.csi.openstack.org",
                "--share-protocol-selector=NFS",
                "--older-than=0s",
            ],
        )
        .await
        .unwrap();
    let ids = |key: &str| report.ids(key);
    // (the cloud may hold other tests' shares granted to this node)
    let held = report.0["report"]["held"].as_array().unwrap();
    let why = held
        .iter()
        .find(|h| h["id"].as_str() == Some(to_node.as_str()))
        .and_then(|h| h["why"].as_str());
    assert!(
        why.is_some_and(|w| w.contains("this-node's address 127.0.0.1/32")),
        "{report:#}"
    );
    assert!(
        !ids("held").contains(&to_other) && !ids("held").contains(&named),
        "{report:#}"
    );
    assert!(ids("orphans").contains(&to_other), "{report:#}");
    assert!(!ids("orphans").contains(&named), "{report:#}");
    for id in [&named, &to_node, &to_other] {
        e.delete(id).await;
    }
}
