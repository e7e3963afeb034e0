//! One kind's objects in the in-memory API, with the list its watch cache would hand out:
//! made once after each change and shared until the next (as the real API's caches do, see
//! `gpuplace_scheduler::api::Listed`), so a view costs a pointer per kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuplace_scheduler::api::Listed;

pub(super) struct Listing<K, V> {
    map: BTreeMap<K, Arc<V>>,
    /// The list of `map`'s values, until `map` changes.
    list: Option<Listed<V>>,
}

impl<K: Ord, V> Default for Listing<K, V> {
    fn default() -> Self {
        Listing {
            map: BTreeMap::new(),
            list: None,
        }
    }
}

impl<K: Ord, V: Clone> Listing<K, V> {
    pub(super) fn insert(&mut self, key: K, value: Arc<V>) -> Option<Arc<V>> {
        self.list = None;
        self.map.insert(key, value)
    }

    pub(super) fn remove<Q>(&mut self, key: &Q) -> Option<Arc<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.list = None;
        self.map.remove(key)
    }

    /// The object under `key`, to change in place (the list is made anew).
    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.list = None;
        self.map.get_mut(key).map(Arc::make_mut)
    }

    /// Every object, in key order: the same list until something changes.
    pub(super) fn listed(&mut self) -> Listed<V> {
        Arc::clone(
            self.list
                .get_or_insert_with(|| Arc::new(self.map.values().cloned().collect())),
        )
    }
}

impl<K, V> std::ops::Deref for Listing<K, V> {
    type Target = BTreeMap<K, Arc<V>>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}
