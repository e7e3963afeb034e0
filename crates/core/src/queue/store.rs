//! Where a [`super::Queue`] keeps its pods' entries: by hash for any key (the scheduler's
//! pod UIDs), or by index for keys numbered from 0 (the timeline's units, whose flushes
//! look one entry up each on a long backlog: a hash table's control bytes and slot are
//! two cache misses where a vector's slot is one).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// A queue's entries (`V`) by key.
pub trait Store<K, V>: Default {
    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;
    fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;
    fn insert(&mut self, key: K, entry: V);
    fn remove<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;
    /// Calls `f` on every entry with its key.
    fn each_mut(&mut self, f: impl FnMut(&K, &mut V));
    /// Calls `f` on every entry.
    fn each(&self, f: impl FnMut(&V));
    /// Keeps the entries whose key `keep` accepts.
    fn retain(&mut self, keep: impl FnMut(&K) -> bool);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Entries in a hash table (foldhash: rounds look every waiting pod up, and SipHash was
/// measured at 13% of a timeline replay).
#[derive(Debug)]
pub struct ByHash<K, V>(HashMap<K, V, foldhash::fast::RandomState>);

impl<K, V> Default for ByHash<K, V> {
    fn default() -> Self {
        ByHash(HashMap::default())
    }
}

impl<K: Hash + Eq, V> Store<K, V> for ByHash<K, V> {
    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.0.get(key)
    }

    fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.0.get_mut(key)
    }

    fn insert(&mut self, key: K, entry: V) {
        self.0.insert(key, entry);
    }

    fn remove<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.0.remove(key);
    }

    fn each_mut(&mut self, mut f: impl FnMut(&K, &mut V)) {
        for (k, e) in self.0.iter_mut() {
            f(k, e);
        }
    }

    fn each(&self, f: impl FnMut(&V)) {
        self.0.values().for_each(f);
    }

    fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.0.retain(|k, _| keep(k));
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Entries by index, for keys numbered from 0 and few gaps (a key's slot is allocated up
/// to it).
#[derive(Debug)]
pub struct ByIndex<V> {
    slots: Vec<Option<V>>,
    len: usize,
}

impl<V> Default for ByIndex<V> {
    fn default() -> Self {
        ByIndex {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<V> Store<u32, V> for ByIndex<V> {
    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        u32: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = u32> + ?Sized,
    {
        let k: u32 = key.to_owned();
        self.slots.get(k as usize)?.as_ref()
    }

    fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        u32: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = u32> + ?Sized,
    {
        let k: u32 = key.to_owned();
        self.slots.get_mut(k as usize)?.as_mut()
    }

    fn insert(&mut self, key: u32, entry: V) {
        let k = key as usize;
        if self.slots.len() <= k {
            self.slots.resize_with(k + 1, || None);
        }
        if self.slots[k].replace(entry).is_none() {
            self.len += 1;
        }
    }

    fn remove<Q>(&mut self, key: &Q)
    where
        u32: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = u32> + ?Sized,
    {
        let k: u32 = key.to_owned();
        if let Some(slot) = self.slots.get_mut(k as usize)
            && slot.take().is_some()
        {
            self.len -= 1;
        }
    }

    fn each_mut(&mut self, mut f: impl FnMut(&u32, &mut V)) {
        for (k, slot) in self.slots.iter_mut().enumerate() {
            if let Some(e) = slot {
                f(&(k as u32), e);
            }
        }
    }

    fn each(&self, f: impl FnMut(&V)) {
        self.slots.iter().flatten().for_each(f);
    }

    fn retain(&mut self, mut keep: impl FnMut(&u32) -> bool) {
        for (k, slot) in self.slots.iter_mut().enumerate() {
            if slot.is_some() && !keep(&(k as u32)) {
                *slot = None;
                self.len -= 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}
