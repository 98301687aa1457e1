//! Non-keyed operator state of one operator instance (WIT `operator-state`, design §10.6,
//! design §3.5 and §10.5): named entries by string id that belong to the subtask, not to a
//! key. The host keeps them in memory, writes them into the subtask's segment file at
//! every barrier (codec `kv-lp/1`, the entry ids as keys) and, on restore, hands every new
//! subtask its entries by each state's [`Redistribution`] ([`redistribute`]).

use nop_stream_api::{OperatorStateDescriptor, Redistribution};
use std::collections::BTreeMap;

/// Most bytes (ids plus values) all operator states of one instance may hold; a `put`
/// past it traps naming the state. Operator state is for small per-subtask data
/// (offsets, rules, a model); large data belongs in keyed state, which spills to redb.
pub const MAX_OPERATOR_STATE_BYTES: usize = 64 << 20;

/// The entries of one operator state of one subtask: (id, value), ascending by id.
pub type Entries = Vec<(String, Vec<u8>)>;

/// The operator states of one instance.
#[derive(Debug, Default)]
pub struct OperatorStates {
    descriptors: Vec<OperatorStateDescriptor>,
    entries: Vec<BTreeMap<String, Vec<u8>>>,
    bytes: usize,
}

impl OperatorStates {
    /// Empty states for the declared `descriptors` (handles are their indices).
    pub fn new(descriptors: Vec<OperatorStateDescriptor>) -> Self {
        OperatorStates {
            entries: vec![BTreeMap::new(); descriptors.len()],
            descriptors,
            bytes: 0,
        }
    }

    /// The declared states, in handle order.
    pub fn descriptors(&self) -> &[OperatorStateDescriptor] {
        &self.descriptors
    }

    /// The handle of state `name`, if declared.
    pub fn handle(&self, name: &str) -> Option<u32> {
        self.descriptors
            .iter()
            .position(|d| d.name == name)
            .map(|i| i as u32)
    }

    fn state(&self, h: u32) -> Result<&BTreeMap<String, Vec<u8>>, String> {
        self.entries
            .get(h as usize)
            .ok_or_else(|| format!("unknown operator-state handle {h}"))
    }

    /// The value of entry `id`.
    ///
    /// # Errors
    /// An unknown handle (the host traps).
    pub fn get(&self, h: u32, id: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.state(h)?.get(id).cloned())
    }

    /// Sets entry `id`.
    ///
    /// # Errors
    /// An unknown handle, or the instance's entries would exceed
    /// [`MAX_OPERATOR_STATE_BYTES`] (the host traps; the state is unchanged).
    pub fn put(&mut self, h: u32, id: String, value: Vec<u8>) -> Result<(), String> {
        let old = self.state(h)?.get(&id).map_or(0, |v| id.len() + v.len());
        let bytes = self.bytes - old + id.len() + value.len();
        if bytes > MAX_OPERATOR_STATE_BYTES {
            return Err(format!(
                "operator state `{}`: the instance's operator states would hold {bytes} bytes, over the limit of {MAX_OPERATOR_STATE_BYTES}; keep large data in keyed state",
                self.descriptors[h as usize].name
            ));
        }
        self.bytes = bytes;
        self.entries[h as usize].insert(id, value);
        Ok(())
    }

    /// Removes entry `id`, if any.
    ///
    /// # Errors
    /// An unknown handle.
    pub fn remove(&mut self, h: u32, id: &str) -> Result<(), String> {
        self.state(h)?;
        if let Some(v) = self.entries[h as usize].remove(id) {
            self.bytes -= id.len() + v.len();
        }
        Ok(())
    }

    /// Every entry of state `h`, ascending by id.
    ///
    /// # Errors
    /// An unknown handle.
    pub fn entries(&self, h: u32) -> Result<Vec<(String, Vec<u8>)>, String> {
        Ok(self
            .state(h)?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// Replaces the entries of state `h` (a restore).
    ///
    /// # Errors
    /// The instance's entries would exceed [`MAX_OPERATOR_STATE_BYTES`] (a union restore
    /// hands every subtask every entry); the state is unchanged.
    pub fn set_entries(&mut self, h: u32, entries: Vec<(String, Vec<u8>)>) -> Result<(), String> {
        let old: usize = self.entries[h as usize]
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        let new: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        let bytes = self.bytes - old + new;
        if bytes > MAX_OPERATOR_STATE_BYTES {
            return Err(format!(
                "operator state `{}`: the restored entries would hold {bytes} bytes, over the limit of {MAX_OPERATOR_STATE_BYTES}",
                self.descriptors[h as usize].name
            ));
        }
        self.bytes = bytes;
        self.entries[h as usize] = entries.into_iter().collect();
        Ok(())
    }

    /// Every declared state with its `kv-lp/1` payload and entry count, in handle order
    /// (empty states too, so a restore knows every old subtask).
    pub fn snapshot(&self) -> Vec<(&OperatorStateDescriptor, Vec<u8>, u64)> {
        self.descriptors
            .iter()
            .zip(&self.entries)
            .map(|(d, e)| {
                let mut payload = Vec::new();
                for (k, v) in e {
                    push_item(&mut payload, k.as_bytes());
                    push_item(&mut payload, v);
                }
                (d, payload, e.len() as u64)
            })
            .collect()
    }
}

fn push_item(out: &mut Vec<u8>, item: &[u8]) {
    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
    out.extend_from_slice(item);
}

/// Decodes a `kv-lp/1` payload of operator-state entries (UTF-8 ids).
///
/// # Errors
/// A truncated payload, an odd number of items or an id that is not UTF-8.
pub fn decode(mut buf: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut items = Vec::new();
    while !buf.is_empty() {
        let len = buf
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("truncated length")?;
        items.push(buf.get(4..4 + len).ok_or("truncated item")?);
        buf = &buf[4 + len..];
    }
    if items.len() % 2 != 0 {
        return Err("odd number of items".into());
    }
    items
        .chunks(2)
        .map(|c| {
            let id = std::str::from_utf8(c[0]).map_err(|_| "an entry id is not UTF-8")?;
            Ok((id.to_owned(), c[1].to_vec()))
        })
        .collect()
}

/// The entries new subtask `index` of `parallelism` gets of one operator state, given
/// every old subtask's entries (`old[i]` = subtask `i` of `old.len()`), by `policy`
/// (design §10.5):
/// - at the same parallelism, every policy but `union` gives a subtask its own entries;
/// - `split-registry`: all entries pooled, dealt in ascending id order round robin (the
///   `k`-th id goes to subtask `k mod parallelism`);
/// - `union`: every entry of every old subtask, in (old subtask, id) order (equal copies
///   of an id held by several old subtasks once);
/// - `broadcast`: old subtask 0's entries, after checking every old subtask holds the same;
/// - `none`: refused (the savepoint check asks for `drop-state` first).
///
/// # Errors
/// A message naming the state and what is wrong: an id held by two old subtasks with
/// different values (split, union), old copies that differ (broadcast), or a `none` state at another parallelism.
pub fn redistribute(
    name: &str,
    policy: Redistribution,
    old: &[Vec<(String, Vec<u8>)>],
    index: u32,
    parallelism: u32,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let same = old.len() == parallelism as usize;
    // Every id once. An id several old subtasks hold with the same value is one entry:
    // that is what a union restore leaves behind when the plugin keeps what it was handed
    // (every subtask then snapshots every entry), and refusing it would make the job's own
    // next checkpoint unrestorable. Copies that differ are refused.
    let unique = || -> Result<BTreeMap<&String, &Vec<u8>>, String> {
        let mut all = BTreeMap::new();
        let mut owner = BTreeMap::new();
        for (i, entries) in old.iter().enumerate() {
            for (k, v) in entries {
                if let Some(&j) = owner.get(k) {
                    if all.get(k) == Some(&v) {
                        continue;
                    }
                    return Err(format!(
                        "operator state `{name}` ({policy}): entry `{k}` is held by old subtasks {j} and {i} with different values; ids must be unique across subtasks"
                    ));
                }
                owner.insert(k, i);
                all.insert(k, v);
            }
        }
        Ok(all)
    };
    match policy {
        Redistribution::Union => {
            unique()?;
            let mut seen = std::collections::BTreeSet::new();
            Ok(old
                .iter()
                .flatten()
                .filter(|(k, _)| seen.insert(k))
                .cloned()
                .collect())
        }
        _ if same => Ok(old[index as usize].clone()),
        Redistribution::SplitRegistry => Ok(unique()?
            .into_iter()
            .enumerate()
            .filter(|(k, _)| *k as u32 % parallelism == index)
            .map(|(_, (k, v))| (k.clone(), v.clone()))
            .collect()),
        Redistribution::Broadcast => {
            if let Some(i) = old.iter().position(|e| *e != old[0]) {
                return Err(format!(
                    "operator state `{name}` (broadcast): old subtasks 0 and {i} hold different entries; a broadcast state must be the same in every subtask"
                ));
            }
            Ok(old.first().cloned().unwrap_or_default())
        }
        Redistribution::None => Err(format!(
            "operator state `{name}` declares no redistribution policy (none) and cannot move from parallelism {} to {parallelism}; restore from a savepoint with a drop-state action for it (`nopstream run --from-savepoint SP --actions A.toml`)",
            old.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(ids: &[&str]) -> Vec<(String, Vec<u8>)> {
        ids.iter()
            .map(|i| (i.to_string(), i.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn same_parallelism_keeps_each_subtasks_entries_but_union_gives_all() {
        let old = vec![e(&["a", "c"]), e(&["b"])];
        for p in [Redistribution::SplitRegistry, Redistribution::None] {
            assert_eq!(redistribute("s", p, &old, 1, 2).unwrap(), e(&["b"]));
        }
        assert_eq!(
            redistribute("s", Redistribution::Union, &old, 1, 2).unwrap(),
            e(&["a", "c", "b"])
        );
    }

    #[test]
    fn broadcast_needs_equal_copies_and_none_refuses_a_rescale() {
        let same = vec![e(&["r1", "r2"]), e(&["r1", "r2"])];
        assert_eq!(
            redistribute("rules", Redistribution::Broadcast, &same, 2, 3).unwrap(),
            e(&["r1", "r2"])
        );
        let differ = vec![e(&["r1"]), e(&["r2"])];
        let err = redistribute("rules", Redistribution::Broadcast, &differ, 0, 3).unwrap_err();
        assert!(err.contains("`rules`") && err.contains("0 and 1"), "{err}");
        let err = redistribute("buf", Redistribution::None, &differ, 0, 3).unwrap_err();
        assert!(err.contains("`buf`") && err.contains("drop-state"), "{err}");
        let dup = vec![e(&["x"]), vec![("x".to_string(), b"y".to_vec())]];
        let err = redistribute("off", Redistribution::SplitRegistry, &dup, 0, 3).unwrap_err();
        assert!(err.contains("`x`") && err.contains("0 and 1"), "{err}");
        // Equal copies of an id count once.
        let same = vec![e(&["x"]), e(&["x"])];
        assert_eq!(
            redistribute("off", Redistribution::SplitRegistry, &same, 0, 3).unwrap(),
            e(&["x"])
        );
    }

    #[test]
    fn snapshot_round_trips_and_the_byte_limit_holds() {
        let d = OperatorStateDescriptor {
            name: "s".into(),
            schema_version: 1,
            codec: "postcard".into(),
            redistribution: Redistribution::Union,
            schema_sha256: None,
        };
        let mut st = OperatorStates::new(vec![d]);
        st.put(0, "b".into(), vec![2; 3]).unwrap();
        st.put(0, "a".into(), vec![]).unwrap();
        let (_, payload, n) = st.snapshot().remove(0);
        assert_eq!(n, 2);
        assert_eq!(
            decode(&payload).unwrap(),
            vec![("a".into(), vec![]), ("b".into(), vec![2; 3])]
        );
        let err = st
            .put(0, "big".into(), vec![0; MAX_OPERATOR_STATE_BYTES])
            .unwrap_err();
        assert!(err.contains("`s`") && err.contains("limit"), "{err}");
        assert_eq!(st.get(0, "big").unwrap(), None);
        st.remove(0, "b").unwrap();
        // "a" (1 byte) + "c" (1 byte) + its value fill the limit exactly.
        st.put(0, "c".into(), vec![0; MAX_OPERATOR_STATE_BYTES - 2])
            .unwrap();
        assert!(st.get(7, "a").is_err());
    }

    proptest! {
        /// Split redistribution is a balanced partition of the pooled entries for every
        /// old and new parallelism, and a chain N→M→N of restores keeps every entry.
        #[test]
        fn split_is_a_balanced_partition(n in 1usize..6, m in 1u32..7, ids in proptest::collection::btree_set("[a-z]{1,4}", 0..40)) {
            let ids: Vec<String> = ids.into_iter().collect();
            let mut old = vec![Vec::new(); n];
            for (i, id) in ids.iter().enumerate() {
                old[i % n].push((id.clone(), id.as_bytes().to_vec()));
            }
            for o in &mut old { o.sort(); }
            let new: Vec<_> = (0..m)
                .map(|j| redistribute("s", Redistribution::SplitRegistry, &old, j, m).unwrap())
                .collect();
            let sizes: Vec<usize> = new.iter().map(Vec::len).collect();
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            let mut all: Vec<String> = new.iter().flatten().map(|(k, _)| k.clone()).collect();
            all.sort();
            prop_assert_eq!(&all, &ids);
            let back: Vec<_> = (0..n as u32)
                .map(|j| redistribute("s", Redistribution::SplitRegistry, &new, j, n as u32).unwrap())
                .collect();
            let mut again: Vec<String> = back.iter().flatten().map(|(k, _)| k.clone()).collect();
            again.sort();
            prop_assert_eq!(again, ids);
        }
    }
}
