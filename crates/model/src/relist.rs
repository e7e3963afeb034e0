//! The one watch-fed store behind every watch gpuplace keeps of pods: the scheduler's pod
//! store and the device plugin's store of its node's pods both hold their converted pods
//! here.
//!
//! It follows a list-then-watch stream the way kube's reflector store does: objects are
//! kept by namespace and name; a relist is collected aside and swapped in whole when it
//! completes, so a reader never sees a mix of two lists, and objects deleted during a watch
//! gap disappear with the swap. Values are shared (`Arc`), so a reader's copy of the store
//! is cheap and an unchanged object stays the same allocation.

use std::collections::BTreeMap;
use std::sync::Arc;

/// An object's namespace and name.
pub type ObjectKey = (String, String);

/// Objects by namespace and name, plus a relist in progress.
#[derive(Debug, Clone)]
pub struct RelistStore<V> {
    items: BTreeMap<ObjectKey, Arc<V>>,
    relist: Option<BTreeMap<ObjectKey, Arc<V>>>,
    listed: bool,
}

impl<V> Default for RelistStore<V> {
    fn default() -> Self {
        RelistStore {
            items: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<V> RelistStore<V> {
    /// The current object under `key` (not one of a relist in progress).
    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<V>> {
        self.items.get(key)
    }

    /// An object was added or changed; returns the one it replaces.
    pub fn apply(&mut self, key: ObjectKey, value: Arc<V>) -> Option<Arc<V>> {
        self.items.insert(key, value)
    }

    /// An object was deleted; returns it if it was known.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Arc<V>> {
        self.items.remove(key)
    }

    /// The watch restarted: a full list follows.
    pub fn begin_relist(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    /// One object of the list in progress (a relist is begun if none is).
    pub fn relisted(&mut self, key: ObjectKey, value: Arc<V>) {
        self.relist
            .get_or_insert_with(BTreeMap::new)
            .insert(key, value);
    }

    /// The list is complete: it replaces the store (objects deleted meanwhile disappear).
    pub fn relist_done(&mut self) {
        if let Some(items) = self.relist.take() {
            self.items = items;
        }
        self.listed = true;
    }

    /// Whether a first full list has arrived.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every current object, sorted by namespace and name.
    pub fn items(&self) -> &BTreeMap<ObjectKey, Arc<V>> {
        &self.items
    }

    /// The current objects, sorted by namespace and name.
    pub fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.items.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ("ns".into(), name.into())
    }

    #[test]
    fn a_relist_is_swapped_in_whole() {
        let mut store = RelistStore::default();
        store.apply(key("a"), Arc::new(1));
        store.apply(key("b"), Arc::new(2));
        store.begin_relist();
        store.relisted(key("b"), Arc::new(3));
        assert_eq!(
            store.len(),
            2,
            "the old list stands until the new one is complete"
        );
        assert!(!store.is_listed());
        store.relist_done();
        assert!(store.is_listed());
        assert_eq!(store.get(&key("a")), None, "deleted during the gap");
        assert_eq!(store.get(&key("b")).map(|v| **v), Some(3));
        assert_eq!(store.remove(&key("b")).map(|v| *v), Some(3));
        assert!(store.is_empty());
    }

    #[test]
    fn a_relist_without_a_beginning_still_replaces_on_completion() {
        let mut store = RelistStore::default();
        store.apply(key("a"), Arc::new(1));
        store.relisted(key("c"), Arc::new(4));
        store.relist_done();
        let names: Vec<&str> = store.items().keys().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, ["c"]);
    }
}
