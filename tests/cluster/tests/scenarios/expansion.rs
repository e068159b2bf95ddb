//! Recovery from a failed expansion (KEP-1790, GA in Kubernetes 1.34): an
//! expansion the project's quota refuses is infeasible, the claim says so,
//! and the user who lowers the request to a size the quota allows gets
//! that size. The driver's part is the code of the refusal (OutOfRange,
//! which external-resizer takes as infeasible) and taking the smaller size
//! afterwards; the rest is Kubernetes', driven here as users do, against
//! real Cinder's quota.

use std::collections::BTreeMap;

use super::*;

/// A volume type of its own, with a quota of 4 GiB for the drivers'
/// project (Cinder's per-type quota, `gigabytes_<type>`): nothing else in
/// the cluster tier is held by it. Unlimited again when dropped.
struct TypeQuota {
    cinder: openstack_client::cinder::BlockStorage,
    project: String,
    key: String,
}

impl TypeQuota {
    async fn set(c: &Cluster, volume_type: &str, gib: i64) -> Self {
        // the cloud's admin sets the quota of the drivers' project
        let project = c
            .session("member")
            .unwrap()
            .project_id()
            .await
            .unwrap()
            .expect("the member's token names its project");
        let cinder = openstack_client::cinder::BlockStorage::new(c.session("admin").unwrap());
        if cinder.get_volume_type(volume_type).await.is_err() {
            cinder
                .create_volume_type(volume_type, &BTreeMap::new())
                .await
                .unwrap();
        }
        let key = format!("gigabytes_{volume_type}");
        cinder
            .set_quotas(&project, &BTreeMap::from([(key.clone(), gib)]))
            .await
            .unwrap();
        Self {
            cinder,
            project,
            key,
        }
    }

    async fn lift(&self) {
        self.cinder
            .set_quotas(&self.project, &BTreeMap::from([(self.key.clone(), -1)]))
            .await
            .unwrap();
    }
}

/// What the claim's status says of its expansion: the resize status of
/// its storage (`ControllerResizeInfeasible`, …, or empty) and the size
/// allocated to it.
async fn resize_status(c: &Cluster, n: &str, claim: &str) -> (String, String) {
    let pvc = c.get("pvc", claim, Some(n)).await.unwrap().unwrap();
    let status = &pvc["status"];
    (
        status["allocatedResourceStatuses"]["storage"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        status["allocatedResources"]["storage"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn request(c: &Cluster, n: &str, claim: &str, size: &str) {
    c.kubectl(&[
        "patch",
        "pvc",
        claim,
        "-n",
        n,
        "-p",
        &format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#),
    ])
    .await
    .unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn an_expansion_over_quota_is_infeasible_and_a_lowered_request_gets_its_size() {
    let (c, _ns, n) = scenario("regrow").await;
    let volume_type = "quota-bound";
    let quota = TypeQuota::set(&c, volume_type, 4).await;
    let class = format!("{n}-quota-bound");
    c.apply(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {class}\n  labels:\n    csi-cluster-tier: test\nprovisioner: cinder.csi.openstack.org\nallowVolumeExpansion: true\nvolumeBindingMode: Immediate\nparameters:\n  type: {volume_type}\n"
    ))
    .await
    .unwrap();
    make(
        &c,
        &n,
        &[claim("data", &class, "1Gi", "ReadWriteOnce", false)],
    )
    .await;
    let pv = c.volume_of(&n, "data", 3 * MINUTE).await.unwrap();
    let id = handle(&pv);
    let cinder = c.cinder().unwrap();

    // more than the type's quota allows: infeasible, nothing changed
    request(&c, &n, "data", "10Gi").await;
    c.wait_for("the claim's expansion infeasible", 3 * MINUTE, || async {
        let (status, allocated) = resize_status(&c, &n, "data").await;
        Ok(if status == "ControllerResizeInfeasible" {
            Ok(())
        } else {
            Err(format!("resize status {status:?}, allocated {allocated:?}"))
        })
    })
    .await
    .unwrap();
    let events = c
        .kubectl(&[
            "get",
            "events",
            "-n",
            &n,
            "--field-selector",
            "involvedObject.name=data",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .await
        .unwrap();
    assert!(
        events.contains("quota") && events.contains("lower the claim's request"),
        "the user is told why and what to do: {events}"
    );
    assert_eq!(cinder.get_volume(&id).await.unwrap().size, 1);

    // the user lowers the request below what failed (above what the
    // claim has): the resizer asks that size, and the driver gives it
    request(&c, &n, "data", "3Gi").await;
    c.wait_for(
        "the volume grown to the lowered request",
        3 * MINUTE,
        || async {
            let v = cinder
                .get_volume(&id)
                .await
                .map_err(|e| cluster_tests::ClusterError::Other(e.to_string()))?;
            let pv = c.get("pv", &name(&pv), None).await?.unwrap_or_default();
            let (status, allocated) = resize_status(&c, &n, "data").await;
            Ok(
                if v.size == 3
                    && pv["spec"]["capacity"]["storage"] == "3Gi"
                    && status != "ControllerResizeInfeasible"
                {
                    Ok(())
                } else {
                    Err(format!(
                        "Cinder {} GiB, PV {}, resize status {status:?}, allocated {allocated:?}",
                        v.size, pv["spec"]["capacity"]["storage"]
                    ))
                },
            )
        },
    )
    .await
    .unwrap();
    let (_, allocated) = resize_status(&c, &n, "data").await;
    assert_eq!(
        allocated, "3Gi",
        "the claim holds what it got, not what failed"
    );

    c.delete("pvc", "data", Some(&n)).await.unwrap();
    wait_volume_gone(&c, &id).await;
    c.delete("storageclass", &class, None).await.unwrap();
    quota.lift().await;
}
