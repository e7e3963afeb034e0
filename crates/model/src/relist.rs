//! The one watch-fed store behind every watch gpuplace keeps of pods: the scheduler's pod
//! store and the device plugin's store of its node's pods both hold their converted pods
//! here.
//!
//! It follows a list-then-watch stream the way kube's reflector store does: objects are
//! kept by namespace and name; a relist is collected aside and swapped in whole when it
//! completes, so a reader never sees a mix of two lists, and objects deleted during a watch
//! gap disappear with the swap. Values are shared (`Arc`), so a reader's copy of the store
//! is cheap and an unchanged object stays the same allocation.
//!
//! A store made [`journaled`](RelistStore::journaled) is also a change feed: it remembers
//! its latest changes (each object's key and the value it replaced), so a reader that keeps
//! its own state up to date asks for what changed since its [`Cursor`] and does work in
//! proportion to the changes, not to the objects. A relist swap, or a reader further behind
//! than the journal remembers, answers "read everything" instead.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// An object's namespace and name.
pub type ObjectKey = (String, String);

/// Where a reader of the change feed stands: the list it read (relists start a new one)
/// and the last change it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    list: u64,
    seq: u64,
}

/// One object changed since a cursor: its value then (`None`: it did not exist) and now
/// (`None`: it was deleted). Several changes of one object come as one.
#[derive(Debug, PartialEq)]
pub struct Change<V> {
    pub key: ObjectKey,
    pub before: Option<Arc<V>>,
    pub after: Option<Arc<V>>,
}

/// One remembered change: its number, the object, the value it replaced.
#[derive(Debug, Clone)]
struct Entry<V> {
    seq: u64,
    key: ObjectKey,
    before: Option<Arc<V>>,
}

/// Objects by namespace and name, plus a relist in progress.
#[derive(Debug, Clone)]
pub struct RelistStore<V> {
    items: BTreeMap<ObjectKey, Arc<V>>,
    relist: Option<BTreeMap<ObjectKey, Arc<V>>>,
    listed: bool,
    /// Completed lists so far (a cursor of an earlier list cannot be followed).
    lists: u64,
    /// Changes so far.
    seq: u64,
    /// The latest changes, oldest first, at most `capacity`.
    journal: VecDeque<Entry<V>>,
    capacity: usize,
}

impl<V> Default for RelistStore<V> {
    fn default() -> Self {
        RelistStore {
            items: BTreeMap::new(),
            relist: None,
            listed: false,
            lists: 0,
            seq: 0,
            journal: VecDeque::new(),
            capacity: 0,
        }
    }
}

impl<V> RelistStore<V> {
    /// A store that remembers its latest `capacity` changes for [`changes_since`](Self::changes_since).
    pub fn journaled(capacity: usize) -> Self {
        RelistStore {
            capacity,
            ..RelistStore::default()
        }
    }

    fn record(&mut self, key: ObjectKey, before: Option<Arc<V>>) {
        self.seq += 1;
        if self.capacity == 0 {
            return;
        }
        if self.journal.len() == self.capacity {
            self.journal.pop_front();
        }
        self.journal.push_back(Entry {
            seq: self.seq,
            key,
            before,
        });
    }

    /// Where a reader that has seen the store as it is now stands.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            list: self.lists,
            seq: self.seq,
        }
    }

    /// The objects changed since `since`, in the order of their first change, or `None`
    /// when the journal cannot say (a relist came since, or more changes than it keeps):
    /// then the reader reads every object again.
    pub fn changes_since(&self, since: Cursor) -> Option<Vec<Change<V>>> {
        if since.list != self.lists || since.seq > self.seq {
            return None;
        }
        let missed = (self.seq - since.seq) as usize;
        if missed > self.journal.len() {
            return None;
        }
        let mut firsts: HashMap<&ObjectKey, usize> = HashMap::with_capacity(missed);
        let mut changes: Vec<Change<V>> = Vec::new();
        for entry in self.journal.iter().skip(self.journal.len() - missed) {
            debug_assert!(entry.seq > since.seq);
            firsts.entry(&entry.key).or_insert_with(|| {
                changes.push(Change {
                    key: entry.key.clone(),
                    before: entry.before.clone(),
                    after: None,
                });
                changes.len() - 1
            });
        }
        for change in &mut changes {
            change.after = self.items.get(&change.key).cloned();
        }
        // An object added and deleted again since, or given the same value: no change.
        changes.retain(|c| match (&c.before, &c.after) {
            (Some(b), Some(a)) => !Arc::ptr_eq(b, a),
            (b, a) => b.is_some() || a.is_some(),
        });
        Some(changes)
    }

    /// Forgets the remembered changes up to `seen`, where a reader that has read them stands,
    /// and so frees the values they replaced. A reader still behind `seen` reads every
    /// object again (as one further behind than the journal keeps); a cursor of another
    /// list forgets nothing.
    pub fn forget_until(&mut self, seen: Cursor) {
        if seen.list != self.lists {
            return;
        }
        while self.journal.front().is_some_and(|e| e.seq <= seen.seq) {
            self.journal.pop_front();
        }
    }

    /// The current object under `key` (not one of a relist in progress).
    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<V>> {
        self.items.get(key)
    }

    /// The object under `key` in the list in progress, if one is and has it.
    pub fn listing(&self, key: &ObjectKey) -> Option<&Arc<V>> {
        self.relist.as_ref()?.get(key)
    }

    /// An object was added or changed; returns the one it replaces.
    pub fn apply(&mut self, key: ObjectKey, value: Arc<V>) -> Option<Arc<V>> {
        let before = self.items.insert(key.clone(), value);
        self.record(key, before.clone());
        before
    }

    /// An object was deleted; returns it if it was known.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Arc<V>> {
        let before = self.items.remove(key);
        if before.is_some() {
            self.record(key.clone(), before.clone());
        }
        before
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
        // Readers of the feed read the new list whole.
        self.lists += 1;
        self.journal.clear();
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

    fn names<V: std::fmt::Debug>(changes: &[Change<V>]) -> Vec<String> {
        changes
            .iter()
            .map(|c| format!("{}:{:?}>{:?}", c.key.1, c.before, c.after))
            .collect()
    }

    #[test]
    fn the_journal_says_what_changed_since_a_cursor() {
        let mut store = RelistStore::journaled(4);
        store.apply(key("a"), Arc::new(1));
        store.relist_done();
        let start = store.cursor();
        assert_eq!(store.changes_since(start).map(|c| c.len()), Some(0));
        store.apply(key("b"), Arc::new(2));
        store.apply(key("a"), Arc::new(3));
        store.apply(key("b"), Arc::new(4));
        store.apply(key("c"), Arc::new(5));
        store.remove(&key("c"));
        assert_eq!(
            store.changes_since(start),
            None,
            "five changes, four remembered: read everything"
        );
        let mid = store.cursor();
        let same = Arc::clone(store.get(&key("a")).unwrap());
        store.apply(key("a"), same);
        store.apply(key("d"), Arc::new(6));
        store.remove(&key("d"));
        store.apply(key("b"), Arc::new(7));
        let changes = store.changes_since(mid).unwrap();
        assert_eq!(names(&changes), ["b:Some(4)>Some(7)"]);
        // A relist starts a new list: older cursors cannot be followed.
        store.begin_relist();
        store.relisted(key("a"), Arc::new(8));
        store.relist_done();
        assert_eq!(store.changes_since(mid), None);
        assert_eq!(
            store.changes_since(store.cursor()).map(|c| c.len()),
            Some(0)
        );
    }

    #[test]
    fn changes_a_reader_has_seen_are_forgotten_and_their_values_freed() {
        let mut store = RelistStore::journaled(16);
        store.relist_done();
        let start = store.cursor();
        let first = Arc::new(1);
        store.apply(key("a"), Arc::clone(&first));
        store.apply(key("a"), Arc::new(2));
        let seen = store.cursor();
        store.apply(key("b"), Arc::new(3));
        // A cursor of an earlier list forgets nothing.
        store.forget_until(Cursor { list: 0, seq: 3 });
        assert_eq!(Arc::strong_count(&first), 2, "remembered as replaced");
        store.forget_until(seen);
        assert_eq!(Arc::strong_count(&first), 1, "freed once forgotten");
        let changes = store.changes_since(seen).unwrap();
        assert_eq!(names(&changes), ["b:None>Some(3)"]);
        assert_eq!(store.changes_since(start), None, "behind: read everything");
        store.forget_until(store.cursor());
        assert_eq!(
            store.changes_since(store.cursor()).map(|c| c.len()),
            Some(0)
        );
    }

    #[test]
    fn an_unjournaled_store_only_follows_a_current_cursor() {
        let mut store = RelistStore::default();
        store.apply(key("a"), Arc::new(1));
        let now = store.cursor();
        assert_eq!(store.changes_since(now).map(|c| c.len()), Some(0));
        store.apply(key("a"), Arc::new(2));
        assert_eq!(store.changes_since(now), None);
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
