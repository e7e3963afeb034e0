//! What the replay waits for between steps when kubelets run, and the objects it makes:
//! pods with their controller, priority, queue and gang, and the gangs' PodGroups.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::cluster::HandshakeCluster;

use super::jobs::StackJob;

/// Makes `job`'s PodGroup if it has one not made yet.
pub(super) fn put_group(api: &crate::api::MemoryApi, names: &[String], job: &StackJob) {
    let Some((first, min_member)) = job.gang else {
        return;
    };
    let name = &names[first];
    if api.group("trace", name).is_some() {
        return;
    }
    let mut group = gpuplace_scheduler::k8s::gang::PodGroup::new(
        name,
        gpuplace_scheduler::k8s::gang::PodGroupSpec {
            min_member,
            ..Default::default()
        },
    );
    group.metadata.namespace = Some("trace".into());
    api.put_group(group);
}

/// The first job of `k`'s line of replacements: its ReplicaSet's.
pub(super) fn controller(jobs: &[StackJob], mut k: usize) -> usize {
    while let Some(v) = jobs[k].replaces {
        k = v;
    }
    k
}

/// Waits until the pods `evicted` are gone from the API (their kubelet ended them).
pub(super) async fn settle_gone(
    api: &crate::api::MemoryApi,
    names: &[String],
    evicted: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while evicted
        .iter()
        .any(|&i| api.pod("trace", &names[i]).is_some())
    {
        if Instant::now() >= deadline {
            return Err("evicted pods were not deleted in time".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The pod of job `k` (`job`, named `names[k]`): its request (see
/// [`crate::replay::trace_pod`]), priority, creation time and gang.
pub(super) fn pod(
    names: &[String],
    k: usize,
    job: &StackJob,
    controller: usize,
    created: Timestamp,
) -> k8s_openapi::api::core::v1::Pod {
    let name = &names[k];
    let mut pod = crate::replay::trace_pod(name, &job.request);
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{controller}"),
            uid: format!("rs-uid-{controller}"),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    if job.movable {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(gpuplace_model::keys::MOVABLE_KEY.to_string(), "true".into());
    }
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    if let Some(spec) = pod.spec.as_mut() {
        spec.priority = Some(job.priority);
    }
    if let Some((first, _)) = job.gang {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                gpuplace_model::keys::POD_GROUP_LABEL.to_string(),
                names[first].clone(),
            );
    }
    if let Some(queue) = &job.queue {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                gpuplace_scheduler::k8s::queue::QUEUE_LABEL.to_string(),
                queue.clone(),
            );
    }
    pod
}

/// Waits until no kubelet holds devices for the pods `gone`.
pub(super) async fn settle_deletions(
    cluster: &HandshakeCluster,
    job_names: &[String],
    gone: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    if gone.is_empty() {
        return Ok(());
    }
    let names: std::collections::HashSet<&String> = gone.iter().map(|&i| &job_names[i]).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let held = cluster.nodes.iter().any(|n| n.fake.holds_any_of(&names));
        if !held {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "kubelets still hold devices of deleted pods {names:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until every pod of `bound` is admitted by its kubelet; a refusal is an error.
pub(super) async fn settle_admissions(
    cluster: &HandshakeCluster,
    job_names: &[String],
    bound: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    let names: std::collections::HashSet<&String> = bound.iter().map(|&i| &job_names[i]).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let mut admitted = 0;
        for n in &cluster.nodes {
            let refused = n.fake.with_admissions(|log| {
                let named = log.iter().filter(|a| names.contains(&a.name));
                for a in named {
                    if a.error.is_some() {
                        return Some(format!("kubelet refused {}: {:?}", a.name, a.error));
                    }
                    admitted += 1;
                }
                None
            });
            if let Some(refused) = refused {
                return Err(refused);
            }
        }
        if admitted >= names.len() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{admitted} of {} bound pods admitted in time",
                names.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
