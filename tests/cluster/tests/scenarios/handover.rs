//! A release replaced in place: the node plugins of the release going
//! away must not leave ours unregistered. Upstream's registrar removes
//! its registration socket when it stops; replacing upstream's release
//! with ours, that path is our registrar's by then, and kubelet
//! deregisters the driver on that node. Our plugin, guarding its
//! registrar's socket, puts it back within seconds; where it cannot (its
//! guard's link gone too), our registrar's health check fails while its
//! socket is gone, and kubelet restarts it.

use super::*;

/// The registrar container of the node plugin of `driver_pod_prefix` on
/// `node`: its pod and its restart count.
async fn registrar_on(c: &Cluster, node: &str, driver_pod_prefix: &str) -> (String, i64) {
    let pods = c.list("pods", &["-n", SUITE_NAMESPACE]).await.unwrap();
    let p = pods
        .iter()
        .find(|p| name(p).starts_with(driver_pod_prefix) && p["spec"]["nodeName"] == node)
        .unwrap_or_else(|| panic!("no {driver_pod_prefix} pod on {node}"));
    let restarts = p["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|c| c["name"] == "node-driver-registrar"))
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or_else(|| panic!("no registrar status in {}", name(p)));
    (name(p), restarts)
}

/// Whether the node's CSINode lists `driver`.
async fn registered(c: &Cluster, node: &str, driver: &str) -> bool {
    c.get("csinode", node, None)
        .await
        .unwrap()
        .and_then(|n| n["spec"]["drivers"].as_array().cloned())
        .is_some_and(|d| d.iter().any(|x| x["name"] == driver))
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_registration_socket_removed_under_the_registrar_heals_and_volumes_mount_again() {
    let (c, _ns, n) = scenario("handover").await;
    let node = c.node.clone();
    let driver = "cinder.csi.openstack.org";
    // node A's kubelet directory is the host's
    let socket = std::path::PathBuf::from(format!(
        "/var/lib/kubelet/plugins_registry/{driver}-reg.sock"
    ));
    // (a node plugin just rolled registers a moment after it is Ready)
    c.wait_for(&format!("{driver} registered on {node}"), MINUTE, || {
        let (c, node) = (&c, &node);
        async move {
            Ok(if registered(c, node, driver).await {
                Ok(())
            } else {
                Err("not in its CSINode".to_string())
            })
        }
    })
    .await
    .unwrap();
    let (pod_name, before) = registrar_on(&c, &node, "csi-cinder-nodeplugin-").await;
    assert!(
        std::os::unix::fs::FileTypeExt::is_socket(
            &std::fs::symlink_metadata(&socket).unwrap().file_type()
        ),
        "{} is not the registrar's socket",
        socket.display()
    );

    // what a registrar of another release does on its way out: our
    // plugin puts the socket back (the same one), the registrar untouched
    let ino = |p: &std::path::Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
    };
    let ours = ino(&socket);
    let removed = Instant::now();
    std::fs::remove_file(&socket).unwrap();
    let put_back = c
        .wait_for("our plugin put the registrar's socket back and the driver is registered", MINUTE, || {
            let (c, node, socket, pod_name) = (&c, &node, &socket, &pod_name);
            async move {
                let listed = registered(c, node, driver).await;
                let (now_pod, restarts) = registrar_on(c, node, "csi-cinder-nodeplugin-").await;
                Ok(
                    if now_pod == *pod_name && restarts == before && ino(socket) == ours && listed {
                        Ok(removed.elapsed())
                    } else {
                        Err(format!(
                            "{now_pod}: registrar restarts {restarts} (were {before}), the socket back: {}, CSINode lists it: {listed}",
                            ino(socket) == ours
                        ))
                    },
                )
            }
        })
        .await
        .unwrap();
    println!(
        "registration socket removed: put back by our plugin and the driver registered again after {:.1} s",
        put_back.as_secs_f64()
    );

    // a plugin that cannot put it back (its guard's link gone too, as in
    // upstream's pod, which has no registration folder): the registrar's
    // liveness probe heals it
    let guard = socket.with_file_name(format!(".{driver}-reg.sock.guard"));
    let removed = Instant::now();
    std::fs::remove_file(&socket).unwrap();
    std::fs::remove_file(&guard).unwrap();
    let deregistered = std::sync::Mutex::new(None);
    let healed = c
        .wait_for("the registrar restarted and the driver registered again", 3 * MINUTE, || {
            let (c, node, socket, pod_name) = (&c, &node, &socket, &pod_name);
            let deregistered = &deregistered;
            async move {
                let listed = registered(c, node, driver).await;
                if !listed && let Ok(mut d) = deregistered.lock() {
                    d.get_or_insert(removed.elapsed());
                }
                let (now_pod, restarts) = registrar_on(c, node, "csi-cinder-nodeplugin-").await;
                Ok(
                    if now_pod == *pod_name && restarts > before && socket.exists() && listed {
                        Ok(removed.elapsed())
                    } else {
                        Err(format!(
                            "{now_pod}: registrar restarts {restarts} (were {before}), socket {}, CSINode lists it: {listed}",
                            socket.exists()
                        ))
                    },
                )
            }
        })
        .await
        .unwrap();
    println!(
        "registration socket and the guard's link removed: driver deregistered after {:?}, registrar restarted and the driver registered again after {:.1} s",
        deregistered.lock().ok().and_then(|d| *d),
        healed.as_secs_f64()
    );

    // and kubelet reaches the driver through it: a claim mounts on node A
    make(
        &c,
        &n,
        &[
            claim("after", "csi-cinder-sc-xfs", "1Gi", "ReadWriteOnce", false),
            pod(
                "mounts",
                "after",
                "echo ok > /data/ok && sync && exec sleep 3600",
                PodOptions::default(),
            ),
        ],
    )
    .await;
    c.wait_running(&n, "mounts", 3 * MINUTE).await.unwrap();
}
