//! The scheduler's pod cache: what a watch delivers, kept as [`PodInfo`] in the one
//! watch-fed store ([`gpuplace_model::RelistStore`], shared with the device plugin).
//!
//! Each pod is converted once, when its version arrives, and the decoded object dropped;
//! the same version again (a relist, a resync) keeps the converted one. Node terms equal
//! to another pod's are shared, not copied: the API server gives every pod two default
//! tolerations, so every pod has terms (at 40,000 pods their copies and filter keys were
//! 40 MB of a 414 MB heap peak, heaptrack on the real API server).

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_model::{Change, Cursor, ObjectKey, RelistStore};
use k8s_openapi::api::core::v1::Pod;

use crate::api::{Listed, PodFeed};
use crate::k8s::dra::store::{ClaimHold, ClaimIndex};
use crate::k8s::dra::{ClaimInfo, DraSettings};
use crate::k8s::pod_info::{PodInfo, SchedulingTerms};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// Pod changes the store remembers for readers of its feed: a reader further behind reads
/// every pod again. Readers take the feed on every call (the extender) or round (the
/// loop), far more often than this many changes arrive between two.
pub const FEED_CHANGES: usize = 16_384;

/// Distinct node terms shared at most; past it the table starts afresh (pods converted
/// before keep theirs).
const MAX_SHARED_TERMS: usize = 4096;

fn key_of(pod: &Pod) -> ObjectKey {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Pods by namespace and name, plus a relist in progress.
#[derive(Debug)]
pub struct PodStore {
    gpu_resource: String,
    pods: RelistStore<PodInfo>,
    /// Node terms by filter key, shared by the pods that have them.
    terms: HashMap<Arc<str>, Arc<SchedulingTerms>>,
    /// The last list handed out and where the store stood then: the next one is the same
    /// list while nothing changed, else that list with the changes since applied in place
    /// (once the views holding it are dropped, no copy), so a view costs what changed,
    /// not a pointer per pod.
    listed: Option<(Cursor, Listed<PodInfo>)>,
    /// The DRA claims and the pods that name them.
    claims: ClaimIndex,
    /// Claim changes so far, and the unowned holds as of the last ask (with the pods'
    /// cursor and that count then).
    claim_changes: u64,
    holds: Option<(Cursor, u64, Arc<[ClaimHold]>)>,
    /// Where the feed's reader stood at its last read with a cursor (`None`: no such read
    /// yet): the changes before it are forgotten.
    reader_at: Option<Cursor>,
}

impl PodStore {
    pub fn new(gpu_resource: &str) -> Self {
        PodStore {
            gpu_resource: gpu_resource.to_string(),
            pods: RelistStore::journaled(FEED_CHANGES),
            terms: HashMap::new(),
            listed: None,
            claims: ClaimIndex::default(),
            claim_changes: 0,
            holds: None,
            reader_at: None,
        }
    }

    /// The store, with `settings` saying which claims are gpuplace's.
    pub fn with_dra(mut self, settings: DraSettings) -> Self {
        self.claims = ClaimIndex::new(settings);
        self
    }

    /// The device plugin's GPU resource the pods' demand is read with.
    pub fn gpu_resource(&self) -> &str {
        &self.gpu_resource
    }

    /// The claims it knows.
    pub fn claims(&self) -> &ClaimIndex {
        &self.claims
    }

    /// A ResourceClaim was added or changed: the pods that name it are resolved again.
    pub fn apply_claim(&mut self, claim: &ResourceClaim) {
        let info = ClaimInfo::of(claim, &self.claims.settings);
        self.claim_changes += 1;
        let users = self.claims.apply(info);
        self.resolve_again(&users);
    }

    /// A ResourceClaim was deleted.
    pub fn delete_claim(&mut self, namespace: &str, name: &str) {
        self.claim_changes += 1;
        let users = self.claims.remove(namespace, name);
        self.resolve_again(&users);
    }

    /// The allocated claims no pod here holds ([`ClaimHold`]): recomputed only when a pod
    /// or a claim changed since the last ask.
    pub fn claim_holds(&mut self) -> Arc<[ClaimHold]> {
        let now = self.pods.cursor();
        if let Some((at, changes, holds)) = &self.holds
            && *at == now
            && *changes == self.claim_changes
        {
            return Arc::clone(holds);
        }
        let pods = &self.pods;
        let holds: Arc<[ClaimHold]> = self
            .claims
            .unowned(|key, uid| {
                // Bound and running, or waiting to be placed: not finished.
                pods.get(key)
                    .is_some_and(|pod| pod.key.uid == uid && !pod.is_finished())
            })
            .into();
        self.holds = Some((now, self.claim_changes, Arc::clone(&holds)));
        holds
    }

    /// `info` resolved against the claims (a pod without claims as it is).
    fn resolved(&self, info: PodInfo) -> PodInfo {
        if info.dra.is_none() {
            return info;
        }
        let pods = &self.pods;
        let ns = info.key.namespace.clone();
        let me = (info.key.uid.clone(), info.is_active_bound());
        self.claims.resolve(&info, |name, uid| {
            // The pod resolved is alive as it is now, stored or not yet.
            if uid == me.0 {
                return me.1;
            }
            pods.get(&(ns.clone(), name.to_string()))
                .is_some_and(|p| p.key.uid == uid && p.is_active_bound())
        })
    }

    /// The pods `keys` resolved again against the claims, stored where that changed them.
    fn resolve_again(&mut self, keys: &[ObjectKey]) {
        for key in keys {
            if let Some(next) = self.pods.get(key).cloned().and_then(|i| self.again(&i)) {
                self.pods.apply(key.clone(), next);
            }
            // A pod of a list in progress too: else it comes in with the claim it lacked
            // when it was listed (claims and pods are listed side by side at a start).
            if let Some(next) = self.pods.listing(key).cloned().and_then(|i| self.again(&i)) {
                self.pods.relisted(key.clone(), next);
            }
        }
    }

    /// `info` resolved against the claims as they are now, if that changes it.
    fn again(&mut self, info: &PodInfo) -> Option<Arc<PodInfo>> {
        let next = self.resolved(info.clone());
        let same = next.demand == info.demand
            && next.claim_gpus == info.claim_gpus
            && next.filter_key == info.filter_key
            && next.dra.as_ref().map(|d| &d.plan) == info.dra.as_ref().map(|d| &d.plan);
        (!same).then(|| Arc::new(self.share_terms(next)))
    }

    /// Tracks the claims `key` names (`info`, or none when it is gone) and resolves the
    /// other users of those claims again (a claim's owner may change).
    fn track(&mut self, key: &ObjectKey, info: Option<&PodInfo>) {
        if info.is_none_or(|i| i.dra.is_none()) && !self.claims.names_any(key) {
            return;
        }
        let others = self.claims.track(key, info);
        self.resolve_again(&others);
    }

    /// `info` with its filter key, and its terms where equal, shared with earlier pods.
    fn share_terms(&mut self, mut info: PodInfo) -> PodInfo {
        let Some(terms) = &info.terms else {
            return info;
        };
        match self.terms.get_key_value(&info.filter_key) {
            Some((key, shared)) => {
                // Equal keys may differ in what the key leaves out (preferred affinity).
                if **shared == **terms {
                    info.terms = Some(Arc::clone(shared));
                }
                info.filter_key = Arc::clone(key);
            }
            None => {
                if self.terms.len() >= MAX_SHARED_TERMS {
                    self.terms.clear();
                }
                self.terms
                    .insert(Arc::clone(&info.filter_key), Arc::clone(terms));
            }
        }
        info
    }

    fn convert(&mut self, pod: &Pod, key: &ObjectKey) -> Arc<PodInfo> {
        match self.pods.get(key) {
            // The same version again (a relist, a resync): keep the converted one.
            Some(info)
                if pod.metadata.resource_version.as_deref()
                    == Some(info.resource_version.as_str())
                    && pod.metadata.uid.as_deref() == Some(info.key.uid.as_str()) =>
            {
                Arc::clone(info)
            }
            _ => {
                let info = self.resolved(PodInfo::from_pod(pod, &self.gpu_resource));
                Arc::new(self.share_terms(info))
            }
        }
    }

    /// A pod was added or changed.
    pub fn apply(&mut self, pod: &Pod) {
        let key = key_of(pod);
        let info = self.convert(pod, &key);
        self.pods.apply(key.clone(), Arc::clone(&info));
        self.track(&key, Some(&info));
    }

    /// A pod was deleted.
    pub fn delete(&mut self, pod: &Pod) {
        let key = key_of(pod);
        self.pods.remove(&key);
        self.track(&key, None);
    }

    /// The pod `namespace/name` was deleted (a watch event that carries only the key).
    pub fn delete_key(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.pods.remove(&key);
        self.track(&key, None);
    }

    /// The watch restarted: a full list follows.
    pub fn begin_relist(&mut self) {
        self.pods.begin_relist();
    }

    /// One pod of the list in progress.
    pub fn relisted(&mut self, pod: &Pod) {
        let key = key_of(pod);
        let info = self.convert(pod, &key);
        self.pods.relisted(key.clone(), Arc::clone(&info));
        self.track(&key, Some(&info));
    }

    /// The list is complete: it replaces the cache (pods deleted meanwhile disappear).
    pub fn relist_done(&mut self) {
        self.pods.relist_done();
    }

    /// Whether a first full list has arrived.
    pub fn is_listed(&self) -> bool {
        self.pods.is_listed()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pods changed since `since` (see [`PodFeed`]). The changes before `since` are
    /// forgotten: the feed has one reader (the loop, or the extender), which stands at
    /// `since` or later from now on, and the pod versions those changes replaced would
    /// otherwise stay in memory until [`FEED_CHANGES`] newer ones pushed them out (a pod
    /// leaves one as its claim, its Binding and its status come). Other readers (the map,
    /// `view()`) read with no cursor and keep nothing the reader needs; one further behind
    /// reads every pod again. The list last handed out by [`view`](Self::view) keeps what
    /// it needs to be patched.
    pub fn feed(&mut self, since: Option<Cursor>) -> PodFeed {
        let feed = PodFeed {
            cursor: self.pods.cursor(),
            changes: since.and_then(|c| self.pods.changes_since(c)),
        };
        match since {
            Some(at) => self.reader_at = Some(at),
            // A first read (no cursor) reads every pod: the changes so far are no one's.
            None => {
                self.reader_at.get_or_insert(feed.cursor);
            }
        }
        self.forget();
        feed
    }

    /// Forgets the changes both the feed's reader and the last list are past.
    fn forget(&mut self) {
        let Some(seen) = self.reader_at else {
            return;
        };
        // A list the reader is past is not patched again (the extender reads no list after
        // its first): dropped rather than kept up by the journal; the next view lists anew.
        if self.listed.as_ref().is_some_and(|(at, _)| *at < seen) {
            self.listed = None;
        }
        let seen = match &self.listed {
            Some((at, _)) => seen.min(*at),
            None => seen,
        };
        self.pods.forget_until(seen);
    }

    /// Every pod, sorted by namespace and name.
    pub fn view(&mut self) -> Listed<PodInfo> {
        let now = self.pods.cursor();
        if let Some((at, list)) = &mut self.listed {
            if *at == now {
                return Arc::clone(list);
            }
            // Past a few changes per pod a fresh list is as cheap as shifting entries.
            let changes = self
                .pods
                .changes_since(*at)
                .filter(|c| c.len() <= 64 + list.len() / 16);
            if let Some(changes) = changes {
                let pods = Arc::make_mut(list);
                for change in changes {
                    patch(pods, change);
                }
                *at = now;
                let list = Arc::clone(list);
                self.forget();
                return list;
            }
        }
        let list: Listed<PodInfo> = Arc::new(self.pods.values().cloned().collect());
        self.listed = Some((now, Arc::clone(&list)));
        self.forget();
        list
    }
}

/// `change` applied to `pods`, which are in key order (as the store's own).
fn patch(pods: &mut Vec<Arc<PodInfo>>, change: Change<PodInfo>) {
    let (namespace, name) = &change.key;
    let at = pods.binary_search_by(|p| {
        (p.key.namespace.as_str(), p.key.name.as_str()).cmp(&(namespace.as_str(), name.as_str()))
    });
    match (at, change.after) {
        (Ok(i), Some(after)) => pods[i] = after,
        (Ok(i), None) => {
            pods.remove(i);
        }
        (Err(i), Some(after)) => pods.insert(i, after),
        (Err(_), None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, rv: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "resourceVersion": rv},
            "spec": {"containers": []}
        }))
        .unwrap()
    }

    #[test]
    fn relist_is_swapped_in_whole_and_unchanged_pods_are_not_converted_again() {
        let mut cache = PodStore::new("nvidia.com/gpu");
        cache.begin_relist();
        cache.relisted(&pod("a", "1"));
        cache.relisted(&pod("b", "2"));
        assert!(
            cache.is_empty() && !cache.is_listed(),
            "nothing before the list completes"
        );
        cache.relist_done();
        assert_eq!(cache.len(), 2);
        let a1 = cache.view()[0].clone();
        cache.apply(&pod("a", "3"));
        cache.delete(&pod("b", "2"));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.view()[0].resource_version, "3");
        // A relist after a watch gap: b is gone, a unchanged keeps its conversion.
        cache.begin_relist();
        cache.relisted(&pod("a", "3"));
        let before = cache.view()[0].clone();
        cache.relist_done();
        assert!(Arc::ptr_eq(&before, &cache.view()[0]));
        assert!(!Arc::ptr_eq(&a1, &cache.view()[0]));
    }

    /// At a start pods and claims are listed side by side: a pod listed before its claim
    /// comes in resolved against it, not waiting for it (on the real 1.36 server 122 of
    /// 2,000 claim pods were told "waiting for ResourceClaim" in the first round).
    #[test]
    fn a_pod_listed_before_its_claim_is_resolved_when_the_claim_comes() {
        let mut cache = PodStore::new("nvidia.com/gpu").with_dra(Default::default());
        let claim_pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-p", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}
        }))
        .unwrap();
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-c", "resourceVersion": "2"},
            "spec": {"devices": {"requests": [{"name": "gpu",
                "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 1}}]}}
        }))
        .unwrap();
        cache.begin_relist();
        cache.relisted(&claim_pod);
        cache.apply_claim(&claim);
        cache.relist_done();
        let listed = &cache.view()[0];
        assert_eq!(
            listed.demand.as_ref().map(|d| d.request.gpu_count),
            Ok(1),
            "{listed:?}"
        );
    }

    /// A store listed empty, then pod `a` (version 1) come by the watch.
    fn listed_with_a() -> PodStore {
        let mut cache = PodStore::new("nvidia.com/gpu");
        cache.begin_relist();
        cache.relist_done();
        cache.apply(&pod("a", "1"));
        cache
    }

    /// Versions a pod leaves behind are freed once the feed's reader has read past them,
    /// not kept until 16,384 newer changes push them out: a first read (no cursor) frees
    /// what came before it, a read with a cursor what came before that cursor, and a read
    /// with no cursor by another reader (the map) nothing the feed's reader still needs.
    #[test]
    fn replaced_versions_are_freed_once_the_feed_reader_is_past_them() {
        let mut cache = listed_with_a();
        let first = Arc::clone(&cache.view()[0]);
        cache.apply(&pod("a", "2"));
        assert_eq!(
            Arc::strong_count(&first),
            3,
            "the journal and the last list hold it"
        );
        let fed = cache.feed(None);
        let _ = cache.view();
        assert_eq!(Arc::strong_count(&first), 1, "freed at the first read");
        let second = Arc::clone(&cache.view()[0]);
        cache.apply(&pod("a", "3"));
        let _ = cache.feed(None);
        let changes = cache.feed(Some(fed.cursor)).changes.map(|c| c.len());
        assert_eq!(
            changes,
            Some(1),
            "another reader's read kept the reader's changes"
        );
        let now = cache.feed(Some(fed.cursor)).cursor;
        let _ = cache.view();
        assert!(Arc::strong_count(&second) > 1, "not yet past it");
        let _ = cache.feed(Some(now));
        assert_eq!(
            Arc::strong_count(&second),
            1,
            "freed once the reader is past it"
        );
        assert_eq!(cache.feed(Some(now)).changes.map(|c| c.len()), Some(0));
    }

    /// The extender reads the feed without the list after its first read: the list it
    /// left behind does not keep the versions the feed has moved past.
    #[test]
    fn a_reader_that_reads_no_list_still_frees_versions() {
        let mut cache = listed_with_a();
        let mut at = cache.feed(None).cursor;
        let _ = cache.view();
        for rv in 2..6 {
            let before = Arc::clone(cache.pods.get(&("ns".into(), "a".into())).unwrap());
            cache.apply(&pod("a", &rv.to_string()));
            let fed = cache.feed(Some(at));
            assert_eq!(fed.changes.map(|c| c.len()), Some(1), "version {rv}");
            at = fed.cursor;
            let _ = cache.feed(Some(at));
            assert_eq!(Arc::strong_count(&before), 1, "version {} freed", rv - 1);
        }
        assert_eq!(cache.view()[0].resource_version, "5", "a fresh list");
    }

    fn with_terms(name: &str, preferred_zone: Option<&str>) -> Pod {
        let mut spec = json!({
            "containers": [],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}]
        });
        if let Some(zone) = preferred_zone {
            spec["affinity"] = json!({"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                    "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                        "values": [zone]}]}}]}});
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "resourceVersion": "1"},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn equal_terms_are_shared_and_terms_the_key_leaves_out_are_kept_apart() {
        let mut cache = PodStore::new("nvidia.com/gpu");
        for (name, zone) in [("a", None), ("b", None), ("c", Some("z1"))] {
            cache.apply(&with_terms(name, zone));
        }
        let view = cache.view();
        let (a, b, c) = (&view[0], &view[1], &view[2]);
        let terms = |p: &PodInfo| p.terms.clone().unwrap();
        assert!(Arc::ptr_eq(&terms(a), &terms(b)), "equal terms, one copy");
        assert!(Arc::ptr_eq(&a.filter_key, &b.filter_key));
        // c's preferred affinity is not in the filter key: the key is shared, its terms not.
        assert!(Arc::ptr_eq(&a.filter_key, &c.filter_key));
        assert!(!Arc::ptr_eq(&terms(a), &terms(c)));
        assert!(terms(c).preferred_node_affinity.is_some());
        assert!(terms(a).preferred_node_affinity.is_none());
    }

    /// The list a view hands out, patched in place from the feed, is always the list a
    /// fresh walk of the store gives: through adds, changes, deletes, relists, views held
    /// across changes (then patched on a copy) and bursts past the patching limit.
    #[test]
    fn a_patched_view_is_the_fresh_list() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let step = (0u8..6, 0usize..40, 0u32..4, any::<bool>());
        let mut runner = TestRunner::new(Config {
            cases: 64,
            ..Config::default()
        });
        runner
            .run(&proptest::collection::vec(step, 1..300), |steps| {
                let mut store = PodStore::new("nvidia.com/gpu");
                let mut held = Vec::new();
                let mut rv = 0u64;
                for (op, n, burst, hold) in steps {
                    for k in 0..=burst as usize * 30 * usize::from(op == 5) {
                        rv += 1;
                        let name = format!("p{:02}", (n + k) % 40);
                        match op {
                            0 | 1 | 5 => store.apply(&pod(&name, &rv.to_string())),
                            2 => store.delete_key("ns", &name),
                            3 => {
                                store.begin_relist();
                                for i in (0..40).step_by(n % 5 + 1) {
                                    store.relisted(&pod(&format!("p{i:02}"), &rv.to_string()));
                                }
                                store.relist_done();
                            }
                            _ => {}
                        }
                    }
                    let view = store.view();
                    let fresh: Vec<Arc<PodInfo>> = store.pods.values().cloned().collect();
                    prop_assert_eq!(view.len(), fresh.len());
                    prop_assert!(view.iter().zip(&fresh).all(|(a, b)| Arc::ptr_eq(a, b)));
                    if hold {
                        let copy: Vec<Arc<PodInfo>> = view.to_vec();
                        held.push((view, copy));
                    }
                }
                // Views held across changes were never changed under their holders.
                for (view, copy) in &held {
                    prop_assert_eq!(view.len(), copy.len());
                    prop_assert!(view.iter().zip(copy).all(|(a, b)| Arc::ptr_eq(a, b)));
                }
                Ok(())
            })
            .unwrap();
    }
}
