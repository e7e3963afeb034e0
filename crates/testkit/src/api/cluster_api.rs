//! The scheduler's side of the in-memory API: its watch-fed view (late when the costs say
//! so) and its writes, charged and validated as a server would.

use gpuplace_scheduler::api::{BindRequest, FedView, PodState};
use gpuplace_scheduler::k8s::gang::PodGroupStatus;
use gpuplace_scheduler::k8s::queue::QueueStatus;
use gpuplace_scheduler::{ApiError, ClusterApi, ClusterView, EventRecord, PodKey};
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::costs::{Fault, validate_annotations};
use super::{MemoryApi, Store, lock};

/// What another writer does to a pod just before the fake answers its Binding with a 409.
struct Rewrite {
    what: &'static str,
    change: Box<dyn FnOnce(&mut Pod)>,
}

impl ClusterApi for MemoryApi {
    async fn view(&self) -> Result<ClusterView, ApiError> {
        // Every pod, from no cursor: the same lists as a feed's view.
        self.view_since(None, true).await.map(|fed| fed.view)
    }

    async fn view_since(
        &self,
        since: Option<gpuplace_model::Cursor>,
        with_pods: bool,
    ) -> Result<FedView, ApiError> {
        let mut guard = lock(&self.store);
        let s = &mut *guard;
        s.sync_cache();
        let feed = s.cache.feed(since);
        let pods = if with_pods || feed.changes.is_none() {
            s.cache.view()
        } else {
            Default::default()
        };
        Ok(FedView {
            view: ClusterView {
                nodes: s.nodes.listed(),
                pods,
                groups: s.groups.listed(),
                claims: s.claims.listed(),
                volumes: s.volumes.listed(),
                budgets: s.budgets.listed(),
                queues: s.queues.listed(),
                namespaces: s.namespaces.listed(),
                jobs: self.job_lookup(),
                claim_holds: s.cache.claim_holds(),
                gpu_class: gpuplace_scheduler::k8s::dra::extended::class_for(
                    &s.device_classes,
                    &s.cache.claims().settings,
                    s.cache.gpu_resource(),
                ),
                generation: s.generation,
            },
            feed,
        })
    }

    fn generation(&self) -> u64 {
        let mut s = lock(&self.store);
        s.sync_cache();
        s.generation
    }

    async fn changed(&self, since: u64) {
        let mut pods = self.pod_version.subscribe();
        let mut nodes = self.node_version.subscribe();
        loop {
            let next = {
                let mut s = lock(&self.store);
                s.sync_cache();
                if s.generation > since {
                    return;
                }
                s.next_delivery()
            };
            let delivery = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = pods.changed() => {}
                _ = nodes.changed() => {}
                _ = delivery => {}
            }
        }
    }

    async fn bind(&self, request: &BindRequest) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        let pod = &request.pod;
        let mut s = lock(&self.store);
        // A real server answers a Binding 409 only when the pod is no longer the version
        // the Binding names: someone wrote it. The fake writes it first, so a scheduler
        // that reads the pod again finds what a real one would.
        let key = (pod.namespace.clone(), pod.name.clone());
        let present = s.pods.contains_key(&key);
        let written = if s.fail_binds > 0 && present {
            s.fail_binds -= 1;
            // Someone changed what the pod is (a label): the decision was made on another.
            let n = s.fail_binds.to_string();
            Some(Rewrite {
                what: "the pod's labels changed",
                change: Box::new(move |p: &mut Pod| {
                    p.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert("testkit.gpuplace.io/changed".into(), n);
                }),
            })
        } else if matches!(fault, Some(Fault::Conflict)) && present {
            // Someone wrote the pod's status (a kubelet, a controller): nothing it asks or
            // allows changed.
            Some(Rewrite {
                what: "a status write",
                change: Box::new(|p: &mut Pod| {
                    p.status.get_or_insert_with(Default::default).message =
                        Some("injected status write".into());
                }),
            })
        } else {
            None
        };
        if let Some(Rewrite { what, change }) = written {
            s.write_pod(&key, change);
            let v = s.version;
            drop(s);
            self.pod_version.send_replace(v);
            return Err(ApiError::Conflict(format!(
                "{pod}: Precondition failed: ResourceVersion in precondition: {} (injected: {what})",
                request.resource_version
            )));
        }
        match fault {
            Some(Fault::Conflict) => {
                return Err(ApiError::NotFound(pod.to_string()));
            }
            Some(Fault::Error) => return Err(ApiError::Other("injected 500".into())),
            Some(Fault::TimeoutLost) => return Err(ApiError::Other("injected time-out".into())),
            _ => {}
        }
        if request.node.is_empty() {
            return Err(ApiError::Invalid("target.name: Required value".into()));
        }
        validate_annotations(&request.annotations)?;
        let key = (pod.namespace.clone(), pod.name.clone());
        let current = s
            .pods
            .get(&key)
            .ok_or_else(|| ApiError::NotFound(pod.to_string()))?;
        if !request.resource_version.is_empty()
            && current.metadata.resource_version.as_deref()
                != Some(request.resource_version.as_str())
        {
            return Err(ApiError::Conflict(format!(
                "{pod}: Precondition failed: ResourceVersion in precondition: {}",
                request.resource_version
            )));
        }
        if let Some(node) = current
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::Conflict(format!(
                "pod {pod} is already assigned to node {node:?}"
            )));
        }
        let mut merged = current.metadata.annotations.clone().unwrap_or_default();
        merged.extend(request.annotations.clone());
        validate_annotations(&merged)?;
        s.write_pod(&key, |p| {
            p.spec.get_or_insert_with(Default::default).node_name = Some(request.node.clone());
            p.metadata.annotations = Some(merged);
            // The Binding sets PodScheduled=True, replacing an Unschedulable one (as the
            // API server's BindingREST does).
            set_condition(
                p,
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(crate::clock::server_time())),
                    ..Default::default()
                },
            );
        });
        s.bindings.push((pod.clone(), request.node.clone()));
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        match fault {
            Some(Fault::TimeoutApplied) => Err(ApiError::Other("injected time-out".into())),
            _ => Ok(()),
        }
    }

    async fn write_claim(
        &self,
        write: &gpuplace_scheduler::k8s::dra::write::ClaimWrite,
    ) -> Result<(), ApiError> {
        self.take_claim_write(write).await
    }

    async fn undo_claim(
        &self,
        write: &gpuplace_scheduler::k8s::dra::write::ClaimWrite,
    ) -> Result<(), ApiError> {
        self.take_claim_undo(write).await
    }

    async fn create_claim(
        &self,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> Result<gpuplace_scheduler::api::ClaimMade, ApiError> {
        self.take_claim_create(claim).await
    }

    async fn delete_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        self.take_claim_delete(namespace, name, uid).await
    }

    fn extended_claims_of(
        &self,
        pod: &PodKey,
    ) -> Vec<std::sync::Arc<gpuplace_scheduler::k8s::dra::ClaimInfo>> {
        let mut s = lock(&self.store);
        s.sync_cache();
        s.cache.claims().extended_of(&pod.uid)
    }

    async fn extended_status(
        &self,
        pod: &PodKey,
        status: Option<&k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus>,
    ) -> Result<PodState, ApiError> {
        self.take_extended_status(pod, status).await
    }

    async fn get_pod(&self, pod: &PodKey) -> Result<Option<PodState>, ApiError> {
        let (_permit, fault) = self.charge().await;
        if matches!(
            fault,
            Some(Fault::Error | Fault::TimeoutLost | Fault::TimeoutApplied)
        ) {
            return Err(ApiError::Other("injected 500".into()));
        }
        let s = lock(&self.store);
        Ok(s.pods
            .get(&(pod.namespace.clone(), pod.name.clone()))
            .map(|p| PodState::of(p)))
    }

    async fn event(&self, event: EventRecord) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        s.bump();
        s.events.push(event);
        Ok(())
    }

    async fn evict_to_move(&self, pod: &PodKey, dry_run: bool) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        let stalled = {
            let mut s = lock(&self.store);
            let number = (!dry_run).then(|| {
                let n = s.move_evictions;
                s.move_evictions += 1;
                n
            });
            let refused_now = number.is_some_and(|n| s.refuse_moves_at.contains(&n));
            let refused_pod = s.refuse_moves.is_some_and(|(seed, p)| {
                crate::api::objects::unit_hash(seed, crate::api::objects::text_hash(&pod.uid)) < p
            });
            if refused_now || refused_pod {
                return Err(ApiError::Blocked(
                    "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                ));
            }
            // Once: the next leader's evictions answer.
            let stalled = number.is_some() && number == s.stall_move_at;
            if stalled {
                s.stall_move_at = None;
                s.stall_reached = true;
            }
            stalled
        };
        if stalled {
            std::future::pending::<()>().await;
        }
        self.evict_through_budgets(pod, dry_run)?;
        if !dry_run {
            self.delete_pod_gracefully(&pod.namespace, &pod.name);
        }
        Ok(())
    }

    async fn evict(&self, victim: &PodKey, message: &str, dry_run: bool) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        match fault {
            Some(Fault::Conflict) => return Err(ApiError::Conflict("injected conflict".into())),
            Some(Fault::Error | Fault::TimeoutLost) => {
                return Err(ApiError::Other("injected 500".into()));
            }
            _ => {}
        }
        {
            let mut s = lock(&self.store);
            let key = (victim.namespace.clone(), victim.name.clone());
            if s.refuse_deletes.contains(&key) {
                return Err(ApiError::Other(format!(
                    "{victim}: admission webhook \"protect.example.com\" denied the request"
                )));
            }
            if dry_run {
                // The server's checks, nothing changed; injected 500s hit real requests.
                same_pod(&s, &key, victim)?;
                s.dry_run_deletes += 1;
                return Ok(());
            }
            if s.fail_evictions > 0 {
                s.fail_evictions -= 1;
                return Err(ApiError::Other(format!("{victim}: injected 500")));
            }
            same_pod(&s, &key, victim)?;
            // The DisruptionTarget condition, one write, as kube-scheduler patches it.
            let condition = PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("PreemptionByScheduler".into()),
                message: Some(message.to_string()),
                ..Default::default()
            };
            s.write_pod(&key, |p| set_condition(p, condition));
        }
        self.delete_pod_gracefully(&victim.namespace, &victim.name);
        match fault {
            Some(Fault::TimeoutApplied) => Err(ApiError::Other("injected time-out".into())),
            _ => Ok(()),
        }
    }

    async fn unschedulable(&self, pod: &PodKey, message: &str) -> Result<(), ApiError> {
        let condition = PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.to_string()),
            last_transition_time: Some(Time(crate::clock::server_time())),
            ..Default::default()
        };
        self.write_status(pod, |p| set_condition(p, condition))
            .await
    }

    async fn nominate(&self, pod: &PodKey, node: Option<&str>) -> Result<(), ApiError> {
        let node = node.map(str::to_string);
        self.write_status(pod, |p| {
            p.status
                .get_or_insert_with(Default::default)
                .nominated_node_name = node;
        })
        .await
    }

    async fn queue_status(&self, name: &str, status: QueueStatus) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        self.write_queue_status(name, status)
    }

    async fn queue_event(
        &self,
        queue: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        self.record_queue_event(queue, kind, reason, message)
    }

    async fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: PodGroupStatus,
    ) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        s.generation += 1;
        let rv = s.bump();
        let g = s
            .groups
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| ApiError::NotFound(format!("podgroup {namespace}/{name}")))?;
        g.status = Some(status);
        g.metadata.resource_version = Some(rv);
        s.status_writes += 1;
        Ok(())
    }
}

impl MemoryApi {
    /// A write to an existing pod's status, charged as a request and seen by its watchers.
    async fn write_status(
        &self,
        pod: &PodKey,
        f: impl FnOnce(&mut k8s_openapi::api::core::v1::Pod),
    ) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if fault.is_some() {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        let key = (pod.namespace.clone(), pod.name.clone());
        if !s.pods.contains_key(&key) {
            return Err(ApiError::NotFound(pod.to_string()));
        }
        s.write_pod(&key, f);
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }
}

/// Puts `condition` on the pod in place of any of its type, as a status patch merging
/// conditions by type does.
fn set_condition(pod: &mut k8s_openapi::api::core::v1::Pod, condition: PodCondition) {
    let conditions = pod
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != condition.type_);
    conditions.push(condition);
}

/// The delete's UID precondition as the server checks it: 404 when the pod is gone, 409
/// when the name now holds another pod.
fn same_pod(s: &Store, key: &(String, String), victim: &PodKey) -> Result<(), ApiError> {
    let current = s
        .pods
        .get(key)
        .ok_or_else(|| ApiError::NotFound(victim.to_string()))?;
    if current.metadata.uid.as_deref() != Some(victim.uid.as_str()) {
        return Err(ApiError::Conflict(format!(
            "{victim}: Precondition failed: UID in precondition: {}",
            victim.uid
        )));
    }
    Ok(())
}
