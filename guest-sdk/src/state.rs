//! Typed keyed state over a [`Context`]: [`ValueState`], [`ListState`], [`MapState`];
//! and typed non-keyed operator state, [`OperatorState`].
//!
//! Values (and map user keys) are encoded with `postcard`; the codec name in the
//! descriptor is [`POSTCARD`]. Changing a value type incompatibly needs a new
//! `schema_version` in the descriptor, since a restore refuses a mismatch.
//!
//! Every method takes the namespace-less form; `in_namespace(ns)` gives the same methods
//! scoped to a namespace (a window or pattern id).
//!
//! # Panics
//! Reading a value that does not decode as `T` panics (a trap in a component): it means
//! the stored bytes were written with another schema, which the descriptor's
//! `schema_version` is there to prevent. Encoding panics only if `T`'s `Serialize` impl
//! is unsupported by postcard (e.g. sequences of unknown length).

use crate::{
    Context, OperatorStateDescriptor, Redistribution, Result, StateDescriptor, StateHandle,
    StateKind,
};
use serde::{Serialize, de::DeserializeOwned};
use std::cell::RefCell;
use std::marker::PhantomData;

/// Codec name the typed states declare: `"postcard"`.
pub const POSTCARD: &str = "postcard";

/// Page size [`ValueState::keys`] asks the host for, in keys.
pub const KEYS_PAGE_LIMIT: u32 = 1024;

/// Keys per batched state call when an operator writes a cache back to host state (the
/// SDK's CEP operator and window accumulator cache, `keyed-count`). The host applies a
/// job's state memory budget (`state_memory_bytes`) after each state call, so a
/// write-back in calls of at most this many keys passes the budget by at most that many
/// entries before the host spills; one call for a whole cache (65,536 keys for CEP) passed
/// it by the whole cache.
pub const STATE_WRITE_CHUNK: usize = 1024;

fn described<T: DeserializeOwned>(d: StateDescriptor) -> StateDescriptor {
    match schema_of::<T>() {
        Some(schema) => d.with_schema(schema),
        None => d,
    }
}

/// A canonical description of how `postcard` lays out `T`, derived from `T`'s serde
/// `Deserialize` shape with `serde-reflection`: the typed descriptors send it to the host,
/// whose savepoint check refuses a restore that stores another layout under the same
/// schema version (`STATE_SCHEMA_CHANGED`). Names of types, fields and variants are left
/// out, since postcard does not encode them (renaming a field keeps the layout); field
/// order, types and variant indices are in. `None` if `T` cannot be traced (e.g. a custom
/// `Deserialize` that validates its input); such a state is never compared.
///
/// ```
/// use nop_stream_sdk::schema_of;
/// #[derive(serde::Deserialize)]
/// struct Acc { count: u64, sum: f64 }
/// assert_eq!(schema_of::<Acc>().unwrap(), "postcard:(u64,f64)");
/// assert_eq!(schema_of::<(u64, f64)>(), schema_of::<Acc>());
/// assert_ne!(schema_of::<(u64, i64)>(), schema_of::<Acc>());
/// ```
pub fn schema_of<T: DeserializeOwned>() -> Option<String> {
    use serde_reflection::{ContainerFormat, Error, FormatHolder, Samples, Tracer, TracerConfig};
    let samples = Samples::new();
    // `trace_type` explores every variant of `T` itself only if `T` is an enum; an enum
    // nested in `T` (a field, an `Option`, a map value) is seen one variant per pass, and
    // only once its name is known (the registry's `MissingVariants` names it) can a pass
    // be asked for its next variant. So: trace, learn the incomplete enums' names, trace
    // again from scratch until every known enum is complete, until none is missing.
    // (Before, any state type with a nested enum had no description and was never
    // compared.)
    let mut enums: Vec<String> = Vec::new();
    for _ in 0..64 {
        let mut tracer = Tracer::new(TracerConfig::default());
        let (mut root, _) = tracer.trace_type::<T>(&samples).ok()?;
        for _ in 0..4096 {
            let mut progress = false;
            for name in &enums {
                progress |= tracer.check_incomplete_enum(name).is_some();
            }
            if !progress {
                break;
            }
            tracer.trace_type_once::<T>(&samples).ok()?;
        }
        root.normalize().ok()?;
        match tracer.registry() {
            // An enum reached only through another enum's later variant can be left
            // part-traced (variants found by name but not yet by index, or not at all):
            // serde-reflection then still returns a registry. No description beats an
            // incomplete one.
            Ok(registry)
                if registry.values().any(|c| match c {
                    ContainerFormat::Enum(vs) => {
                        vs.is_empty() || vs.keys().any(|&i| i as usize >= vs.len())
                    }
                    _ => false,
                }) =>
            {
                return None;
            }
            Ok(registry) => {
                let mut out = String::from("postcard:");
                render(&root, &registry, &mut Vec::new(), &mut out);
                return Some(out);
            }
            Err(Error::MissingVariants(missing)) => {
                let new: Vec<String> = missing.into_iter().filter(|m| !enums.contains(m)).collect();
                if new.is_empty() {
                    return None;
                }
                enums.extend(new);
            }
            Err(_) => return None,
        }
    }
    None
}

fn render(
    f: &serde_reflection::Format,
    reg: &serde_reflection::Registry,
    stack: &mut Vec<String>,
    out: &mut String,
) {
    use serde_reflection::{ContainerFormat as C, Format as F, VariantFormat as V};
    let list = |items: &[F], stack: &mut Vec<String>, out: &mut String| {
        out.push('(');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            render(x, reg, stack, out);
        }
        out.push(')');
    };
    let named =
        |items: &[serde_reflection::Named<F>], stack: &mut Vec<String>, out: &mut String| {
            let v: Vec<F> = items.iter().map(|n| n.value.clone()).collect();
            list(&v, stack, out);
        };
    match f {
        F::TypeName(name) => {
            if let Some(depth) = stack.iter().position(|n| n == name) {
                out.push_str(&format!("rec{depth}"));
                return;
            }
            stack.push(name.clone());
            match reg.get(name) {
                None => out.push('?'),
                Some(C::UnitStruct) => out.push_str("()"),
                Some(C::NewTypeStruct(x)) => render(x, reg, stack, out),
                Some(C::TupleStruct(xs)) => list(xs, stack, out),
                Some(C::Struct(xs)) => named(xs, stack, out),
                Some(C::Enum(vs)) => {
                    out.push_str("enum{");
                    for (i, (index, v)) in vs.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&format!("{index}:"));
                        match &v.value {
                            V::Unit => out.push_str("()"),
                            V::NewType(x) => render(x, reg, stack, out),
                            V::Tuple(xs) => list(xs, stack, out),
                            V::Struct(xs) => named(xs, stack, out),
                            V::Variable(_) => out.push('?'),
                        }
                    }
                    out.push('}');
                }
            }
            stack.pop();
        }
        F::Option(x) => {
            out.push_str("option<");
            render(x, reg, stack, out);
            out.push('>');
        }
        F::Seq(x) => {
            out.push_str("seq<");
            render(x, reg, stack, out);
            out.push('>');
        }
        F::Map { key, value } => {
            out.push_str("map<");
            render(key, reg, stack, out);
            out.push(',');
            render(value, reg, stack, out);
            out.push('>');
        }
        F::Tuple(xs) => list(xs, stack, out),
        F::TupleArray { content, size } => {
            out.push_str(&format!("[{size}]"));
            render(content, reg, stack, out);
        }
        F::Variable(_) => out.push('?'),
        prim => out.push_str(&format!("{prim:?}").to_lowercase()),
    }
}

/// Typed non-keyed operator state (WIT `operator-state`, design §10.5): entries
/// of `T` by string id that belong to the operator subtask, not to a key — the offsets a
/// subtask tracks, rules broadcast to every subtask, a small model. The host snapshots
/// them at every barrier and, on a restore at another parallelism, hands them out by the
/// declared [`Redistribution`]. Entries are restored before `open`, so `open` may read
/// them. Values are `postcard`-encoded; all operator states of an instance together may
/// hold at most 64 MiB.
///
/// ```no_run
/// use nop_stream_sdk::{OperatorState, PluginInfo, Redistribution};
/// let info = PluginInfo::operator("dedupe", "0.1.0").operator_state(
///     OperatorState::<u64>::descriptor("seen", 1, Redistribution::Union),
/// );
/// ```
pub struct OperatorState<T> {
    handle: StateHandle,
    name: String,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for OperatorState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorState")
            .field("name", &self.name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> OperatorState<T> {
    /// The descriptor to declare with [`crate::PluginInfo::operator_state`]: codec
    /// `postcard`, the schema derived from `T` ([`schema_of`]).
    pub fn descriptor(
        name: impl Into<String>,
        schema_version: u32,
        redistribution: Redistribution,
    ) -> OperatorStateDescriptor {
        OperatorStateDescriptor {
            name: name.into(),
            schema_version,
            codec: POSTCARD.into(),
            redistribution,
            schema: schema_of::<T>(),
        }
    }

    /// Opens the declared operator state `name`.
    ///
    /// # Errors
    /// Whatever [`Context::open_operator_state`] reports, e.g. an undeclared name.
    pub fn open(ctx: &mut (impl Context + ?Sized), name: &str) -> Result<Self> {
        Ok(OperatorState {
            handle: ctx.open_operator_state(name)?,
            name: name.to_owned(),
            _value: PhantomData,
        })
    }

    /// The value of entry `id`, if any.
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), id: &str) -> Option<T> {
        ctx.operator_state_get(self.handle, id)
            .map(|v| decode(&self.name, &v))
    }

    /// Sets entry `id` to `value`.
    pub fn put(&self, ctx: &mut (impl Context + ?Sized), id: &str, value: &T) {
        let mut buf = Vec::new();
        encode_into(&self.name, value, &mut buf);
        ctx.operator_state_put(self.handle, id, &buf);
    }

    /// Removes entry `id`, if any.
    pub fn remove(&self, ctx: &mut (impl Context + ?Sized), id: &str) {
        ctx.operator_state_remove(self.handle, id);
    }

    /// Every entry this subtask holds, ascending by id.
    pub fn entries(&self, ctx: &mut (impl Context + ?Sized)) -> Vec<(String, T)> {
        ctx.operator_state_entries(self.handle)
            .into_iter()
            .map(|(k, v)| {
                let v = decode(&self.name, &v);
                (k, v)
            })
            .collect()
    }
}

#[derive(Default)]
struct Buffers {
    keys: Vec<u8>,
    key_ends: Vec<u32>,
    values: Vec<u8>,
    value_ends: Vec<u32>,
}

fn encode_into<T: Serialize + ?Sized>(state: &str, value: &T, buf: &mut Vec<u8>) {
    let taken = std::mem::take(buf);
    *buf = postcard::to_extend(value, taken)
        .unwrap_or_else(|e| panic!("state `{state}`: cannot encode value with postcard: {e}"));
}

fn decode<T: DeserializeOwned>(state: &str, bytes: &[u8]) -> T {
    postcard::from_bytes(bytes).unwrap_or_else(|e| {
        panic!("state `{state}`: stored value does not decode ({e}); schema mismatch?")
    })
}

/// Encodes `value` as a [`ValueState`] stores it (postcard): for a [`crate::StateMigration`]
/// writing values of the new schema.
///
/// # Errors
/// A value postcard cannot encode (e.g. a sequence of unknown length).
pub fn encode_value<T: Serialize + ?Sized>(value: &T) -> crate::Result<Vec<u8>> {
    postcard::to_allocvec(value)
        .map_err(|e| crate::PluginError::state(format!("cannot encode value with postcard: {e}")))
}

/// Decodes a value a [`ValueState`] stored (postcard): for a [`crate::StateMigration`]
/// reading values of an old schema.
///
/// # Errors
/// Bytes that are not a postcard `T`.
pub fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> crate::Result<T> {
    postcard::from_bytes(bytes)
        .map_err(|e| crate::PluginError::state(format!("stored value does not decode: {e}")))
}

fn end(len: usize) -> u32 {
    u32::try_from(len).expect("state buffer exceeds u32::MAX bytes")
}

/// One value of type `T` per key (and namespace), stored in host state.
///
/// ```
/// use nop_stream_sdk::{MockContext, PluginInfo, ValueState};
/// let info = PluginInfo::operator("counter", "0.1.0").state(ValueState::<u64>::descriptor("count", 1));
/// let mut ctx = MockContext::new(&info);
/// let count = ValueState::<u64>::open(&mut ctx, "count").unwrap();
/// count.put(&mut ctx, b"k", &3);
/// assert_eq!(count.get(&mut ctx, b"k"), Some(3));
/// ```
pub struct ValueState<T> {
    handle: StateHandle,
    name: String,
    buffers: RefCell<Buffers>,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for ValueState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueState")
            .field("name", &self.name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> ValueState<T> {
    /// The descriptor to declare in `describe()`: kind value, codec `postcard`.
    pub fn descriptor(name: impl Into<String>, schema_version: u32) -> StateDescriptor {
        described::<T>(StateDescriptor::new(
            name,
            StateKind::Value,
            schema_version,
            POSTCARD,
        ))
    }

    /// Opens the declared state `name`.
    ///
    /// # Errors
    /// Whatever [`Context::open_state`] reports, e.g. an undeclared name.
    pub fn open(ctx: &mut (impl Context + ?Sized), name: &str) -> Result<Self> {
        Ok(ValueState {
            handle: ctx.open_state(name)?,
            name: name.to_string(),
            buffers: RefCell::new(Buffers::default()),
            _value: PhantomData,
        })
    }

    /// The host handle of the state.
    pub fn handle(&self) -> StateHandle {
        self.handle
    }

    /// The state's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This state scoped to `namespace`.
    pub fn in_namespace<'a>(&'a self, namespace: &'a [u8]) -> ValueStateIn<'a, T> {
        ValueStateIn {
            state: self,
            namespace,
        }
    }

    /// The value of `key`, if any (one host call).
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Option<T> {
        self.in_namespace(&[]).get(ctx, key)
    }

    /// Stores `value` under `key` (one host call).
    pub fn put(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], value: &T) {
        self.in_namespace(&[]).put(ctx, key, value)
    }

    /// Removes the value of `key`, if any.
    pub fn delete(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        self.in_namespace(&[]).delete(ctx, key)
    }

    /// The values of `keys`, in order, in one host call.
    pub fn get_many(&self, ctx: &mut (impl Context + ?Sized), keys: &[&[u8]]) -> Vec<Option<T>> {
        self.in_namespace(&[]).get_many(ctx, keys)
    }

    /// Stores every `(key, value)` in one host call, reusing the state's encode buffers.
    pub fn put_many(&self, ctx: &mut (impl Context + ?Sized), entries: &[(&[u8], T)]) {
        self.in_namespace(&[]).put_many(ctx, entries)
    }

    /// Every key holding a value in this subtask, ascending (pages of
    /// [`KEYS_PAGE_LIMIT`] keys, one host call each).
    pub fn keys(&self, ctx: &mut (impl Context + ?Sized)) -> Vec<Vec<u8>> {
        self.in_namespace(&[]).keys(ctx)
    }
}

/// A [`ValueState`] scoped to one namespace; see [`ValueState::in_namespace`].
pub struct ValueStateIn<'a, T> {
    state: &'a ValueState<T>,
    namespace: &'a [u8],
}

impl<T: Serialize + DeserializeOwned> ValueStateIn<'_, T> {
    /// The value of `key` in this namespace, if any.
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Option<T> {
        let vb = ctx.value_get_many(self.state.handle, self.namespace, key, &[end(key.len())]);
        vb.get(0).map(|b| decode(&self.state.name, b))
    }

    /// Stores `value` under `key` in this namespace.
    pub fn put(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], value: &T) {
        let mut b = self.state.buffers.borrow_mut();
        b.values.clear();
        encode_into(&self.state.name, value, &mut b.values);
        let vend = [end(b.values.len())];
        ctx.value_put_many(
            self.state.handle,
            self.namespace,
            key,
            &[end(key.len())],
            &b.values,
            &vend,
        );
    }

    /// Removes the value of `key` in this namespace, if any.
    pub fn delete(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        ctx.value_delete(self.state.handle, self.namespace, key);
    }

    /// The values of `keys` in this namespace, in order, in one host call.
    pub fn get_many(&self, ctx: &mut (impl Context + ?Sized), keys: &[&[u8]]) -> Vec<Option<T>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let vb = {
            let mut guard = self.state.buffers.borrow_mut();
            let b = &mut *guard;
            b.keys.clear();
            b.key_ends.clear();
            for k in keys {
                b.keys.extend_from_slice(k);
                b.key_ends.push(end(b.keys.len()));
            }
            ctx.value_get_many(self.state.handle, self.namespace, &b.keys, &b.key_ends)
        };
        (0..keys.len())
            .map(|i| vb.get(i).map(|v| decode(&self.state.name, v)))
            .collect()
    }

    /// The values of the keys laid out flat (`keys` + exclusive `key_ends`, as in a
    /// [`crate::TimerGroup`]), in order, in one host call.
    pub fn get_many_flat(
        &self,
        ctx: &mut (impl Context + ?Sized),
        keys: &[u8],
        key_ends: &[u32],
    ) -> Vec<Option<T>> {
        if key_ends.is_empty() {
            return Vec::new();
        }
        let vb = ctx.value_get_many(self.state.handle, self.namespace, keys, key_ends);
        (0..key_ends.len())
            .map(|i| vb.get(i).map(|v| decode(&self.state.name, v)))
            .collect()
    }

    /// Removes the values of the keys laid out flat (`keys` + exclusive `key_ends`) in
    /// this namespace, in one host call.
    pub fn delete_many_flat(
        &self,
        ctx: &mut (impl Context + ?Sized),
        keys: &[u8],
        key_ends: &[u32],
    ) {
        if !key_ends.is_empty() {
            ctx.value_delete_many(self.state.handle, self.namespace, keys, key_ends);
        }
    }

    /// Stores every `(key, value)` in this namespace in one host call.
    pub fn put_many(&self, ctx: &mut (impl Context + ?Sized), entries: &[(&[u8], T)]) {
        self.put_many_refs(ctx, entries.iter().map(|(k, v)| (*k, v)));
    }

    /// [`Self::put_many`] over borrowed values (an operator that keeps its values
    /// decoded in memory writes them back without moving or cloning them). Nothing is
    /// sent when `entries` is empty.
    pub fn put_many_refs<'v>(
        &self,
        ctx: &mut (impl Context + ?Sized),
        entries: impl IntoIterator<Item = (&'v [u8], &'v T)>,
    ) where
        T: 'v,
    {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return;
        }
        let mut guard = self.state.buffers.borrow_mut();
        let b = &mut *guard;
        b.keys.clear();
        b.key_ends.clear();
        b.values.clear();
        b.value_ends.clear();
        for (k, v) in entries {
            b.keys.extend_from_slice(k);
            b.key_ends.push(end(b.keys.len()));
            encode_into(&self.state.name, v, &mut b.values);
            b.value_ends.push(end(b.values.len()));
        }
        ctx.value_put_many(
            self.state.handle,
            self.namespace,
            &b.keys,
            &b.key_ends,
            &b.values,
            &b.value_ends,
        );
    }

    /// Every key holding a value in this namespace, ascending.
    pub fn keys(&self, ctx: &mut (impl Context + ?Sized)) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        loop {
            let after = out.last().map(Vec::as_slice);
            let page = ctx.value_keys(self.state.handle, self.namespace, after, KEYS_PAGE_LIMIT);
            out.extend(page.iter().map(<[u8]>::to_vec));
            if !page.more || page.is_empty() {
                return out;
            }
        }
    }
}

/// An append-only list of `T` per key (and namespace), stored in host state.
pub struct ListState<T> {
    handle: StateHandle,
    name: String,
    buffer: RefCell<Vec<u8>>,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for ListState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListState")
            .field("name", &self.name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> ListState<T> {
    /// The descriptor to declare in `describe()`: kind list, codec `postcard`.
    pub fn descriptor(name: impl Into<String>, schema_version: u32) -> StateDescriptor {
        described::<T>(StateDescriptor::new(
            name,
            StateKind::List,
            schema_version,
            POSTCARD,
        ))
    }

    /// Opens the declared state `name`.
    ///
    /// # Errors
    /// Whatever [`Context::open_state`] reports, e.g. an undeclared name.
    pub fn open(ctx: &mut (impl Context + ?Sized), name: &str) -> Result<Self> {
        Ok(ListState {
            handle: ctx.open_state(name)?,
            name: name.to_string(),
            buffer: RefCell::new(Vec::new()),
            _value: PhantomData,
        })
    }

    /// The host handle of the state.
    pub fn handle(&self) -> StateHandle {
        self.handle
    }

    /// This state scoped to `namespace`.
    pub fn in_namespace<'a>(&'a self, namespace: &'a [u8]) -> ListStateIn<'a, T> {
        ListStateIn {
            state: self,
            namespace,
        }
    }

    /// Appends `value` to the list of `key`.
    pub fn append(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], value: &T) {
        self.in_namespace(&[]).append(ctx, key, value)
    }

    /// The whole list of `key` (empty if none).
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Vec<T> {
        self.in_namespace(&[]).get(ctx, key)
    }

    /// Removes the list of `key`.
    pub fn clear(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        self.in_namespace(&[]).clear(ctx, key)
    }
}

/// A [`ListState`] scoped to one namespace; see [`ListState::in_namespace`].
pub struct ListStateIn<'a, T> {
    state: &'a ListState<T>,
    namespace: &'a [u8],
}

impl<T: Serialize + DeserializeOwned> ListStateIn<'_, T> {
    /// Appends `value` to the list of `key` in this namespace.
    pub fn append(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], value: &T) {
        let mut buf = self.state.buffer.borrow_mut();
        buf.clear();
        encode_into(&self.state.name, value, &mut buf);
        ctx.list_append(self.state.handle, self.namespace, key, &buf);
    }

    /// The whole list of `key` in this namespace (empty if none).
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Vec<T> {
        ctx.list_get(self.state.handle, self.namespace, key)
            .iter()
            .map(|v| decode(&self.state.name, v))
            .collect()
    }

    /// Removes the list of `key` in this namespace.
    pub fn clear(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        ctx.list_clear(self.state.handle, self.namespace, key);
    }
}

/// A map from user key `K` to value `V` per key (and namespace), stored in host state.
/// User keys are postcard-encoded; entries come back ordered by those encoded bytes.
pub struct MapState<K, V> {
    handle: StateHandle,
    name: String,
    buffers: RefCell<(Vec<u8>, Vec<u8>)>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> std::fmt::Debug for MapState<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapState")
            .field("name", &self.name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<K, V> MapState<K, V>
where
    K: Serialize + DeserializeOwned,
    V: Serialize + DeserializeOwned,
{
    /// The descriptor to declare in `describe()`: kind map, codec `postcard`.
    pub fn descriptor(name: impl Into<String>, schema_version: u32) -> StateDescriptor {
        described::<(K, V)>(StateDescriptor::new(
            name,
            StateKind::Map,
            schema_version,
            POSTCARD,
        ))
    }

    /// Opens the declared state `name`.
    ///
    /// # Errors
    /// Whatever [`Context::open_state`] reports, e.g. an undeclared name.
    pub fn open(ctx: &mut (impl Context + ?Sized), name: &str) -> Result<Self> {
        Ok(MapState {
            handle: ctx.open_state(name)?,
            name: name.to_string(),
            buffers: RefCell::new((Vec::new(), Vec::new())),
            _types: PhantomData,
        })
    }

    /// The host handle of the state.
    pub fn handle(&self) -> StateHandle {
        self.handle
    }

    /// This state scoped to `namespace`.
    pub fn in_namespace<'a>(&'a self, namespace: &'a [u8]) -> MapStateIn<'a, K, V> {
        MapStateIn {
            state: self,
            namespace,
        }
    }

    /// Sets `user_key` to `value` in the map of `key`.
    pub fn put(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K, value: &V) {
        self.in_namespace(&[]).put(ctx, key, user_key, value)
    }

    /// Reads `user_key` from the map of `key`.
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K) -> Option<V> {
        self.in_namespace(&[]).get(ctx, key, user_key)
    }

    /// Removes `user_key` from the map of `key`.
    pub fn remove(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K) {
        self.in_namespace(&[]).remove(ctx, key, user_key)
    }

    /// Every entry of the map of `key`, ordered by encoded user key.
    pub fn entries(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Vec<(K, V)> {
        self.in_namespace(&[]).entries(ctx, key)
    }

    /// Removes the whole map of `key`.
    pub fn clear(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        self.in_namespace(&[]).clear(ctx, key)
    }
}

/// A [`MapState`] scoped to one namespace; see [`MapState::in_namespace`].
pub struct MapStateIn<'a, K, V> {
    state: &'a MapState<K, V>,
    namespace: &'a [u8],
}

impl<K, V> MapStateIn<'_, K, V>
where
    K: Serialize + DeserializeOwned,
    V: Serialize + DeserializeOwned,
{
    /// Sets `user_key` to `value` in the map of `key` in this namespace.
    pub fn put(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K, value: &V) {
        let mut guard = self.state.buffers.borrow_mut();
        let (uk, v) = &mut *guard;
        uk.clear();
        v.clear();
        encode_into(&self.state.name, user_key, uk);
        encode_into(&self.state.name, value, v);
        ctx.map_put(self.state.handle, self.namespace, key, uk, v);
    }

    /// Reads `user_key` from the map of `key` in this namespace.
    pub fn get(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K) -> Option<V> {
        let mut guard = self.state.buffers.borrow_mut();
        let uk = &mut guard.0;
        uk.clear();
        encode_into(&self.state.name, user_key, uk);
        ctx.map_get(self.state.handle, self.namespace, key, uk)
            .map(|v| decode(&self.state.name, &v))
    }

    /// Removes `user_key` from the map of `key` in this namespace.
    pub fn remove(&self, ctx: &mut (impl Context + ?Sized), key: &[u8], user_key: &K) {
        let mut guard = self.state.buffers.borrow_mut();
        let uk = &mut guard.0;
        uk.clear();
        encode_into(&self.state.name, user_key, uk);
        ctx.map_remove(self.state.handle, self.namespace, key, uk);
    }

    /// Every entry of the map of `key` in this namespace, ordered by encoded user key.
    pub fn entries(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) -> Vec<(K, V)> {
        ctx.map_entries(self.state.handle, self.namespace, key)
            .iter()
            .map(|(k, v)| (decode(&self.state.name, k), decode(&self.state.name, v)))
            .collect()
    }

    /// Removes the whole map of `key` in this namespace.
    pub fn clear(&self, ctx: &mut (impl Context + ?Sized), key: &[u8]) {
        ctx.clear(self.state.handle, self.namespace, key);
    }
}
