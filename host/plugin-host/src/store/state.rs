//! The host side of `nop:stream/state` (backed by [`KeyedState`](nop_stream_state::KeyedState))
//! and `nop:stream/operator-state`.

use super::{HostTrap, StoreData, trap};
use crate::bindings::op::nop::stream::{operator_state, state, types};
use crate::bindings::{KeyPage, ValueBatch};

impl types::Host for StoreData {}

impl state::Host for StoreData {
    fn open_state(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        if name.starts_with("__") {
            return Ok(Err(format!(
                "state `{name}`: names starting with `__` are reserved for the host"
            )));
        }
        Ok(match self.state.as_ref().and_then(|s| s.handle(&name)) {
            Some(h) => Ok(h),
            None => Err(format!(
                "state `{name}` is not declared in the plugin's describe()"
            )),
        })
    }

    fn state_ttl(&mut self, state: u32) -> wasmtime::Result<Option<u64>> {
        self.user_handle(state)?;
        self.keyed()?.declared_ttl_ms(state).map_err(trap)
    }

    fn value_get_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
    ) -> wasmtime::Result<ValueBatch> {
        self.user_handle(state)?;
        let mut out = ValueBatch {
            data: Vec::new(),
            ends: Vec::with_capacity(key_ends.len()),
            present: Vec::with_capacity(key_ends.len()),
        };
        self.keyed()?
            .value_get_many(
                state,
                &namespace,
                &keys,
                &key_ends,
                &mut out.data,
                &mut out.ends,
                &mut out.present,
            )
            .map_err(trap)?;
        Ok(out)
    }

    fn value_put_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
        values: Vec<u8>,
        value_ends: Vec<u32>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_put_many(state, &namespace, &keys, &key_ends, &values, &value_ends)
            .map_err(trap)
    }

    fn value_delete(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_delete(state, &namespace, &key)
            .map_err(trap)
    }

    fn value_delete_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_delete_many(state, &namespace, &keys, &key_ends)
            .map_err(trap)
    }

    fn value_keys(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<KeyPage> {
        self.user_handle(state)?;
        let (keys, key_ends, more) = self
            .keyed()?
            .value_keys(state, &namespace, after.as_deref(), limit)
            .map_err(trap)?;
        Ok(KeyPage {
            keys,
            key_ends,
            more,
        })
    }

    fn list_append(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .list_append(state, &namespace, &key, &value)
            .map_err(trap)
    }

    fn list_get(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Vec<Vec<u8>>> {
        self.user_handle(state)?;
        self.keyed()?
            .list_get(state, &namespace, &key)
            .map_err(trap)
    }

    fn list_clear(&mut self, state: u32, namespace: Vec<u8>, key: Vec<u8>) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .list_clear(state, &namespace, &key)
            .map_err(trap)
    }

    fn map_put(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .map_put(state, &namespace, &key, &user_key, &value)
            .map_err(trap)
    }

    fn map_get(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        self.user_handle(state)?;
        self.keyed()?
            .map_get(state, &namespace, &key, &user_key)
            .map_err(trap)
    }

    fn map_remove(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .map_remove(state, &namespace, &key, &user_key)
            .map_err(trap)
    }

    fn map_entries(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.user_handle(state)?;
        self.keyed()?
            .map_entries(state, &namespace, &key)
            .map_err(trap)
    }

    fn clear(&mut self, state: u32, namespace: Vec<u8>, key: Vec<u8>) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?.clear(state, &namespace, &key).map_err(trap)
    }
}

impl operator_state::Host for StoreData {
    fn open_operator_state(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.op_state.handle(&name).ok_or_else(|| {
            format!("operator state `{name}` is not declared in the plugin's state declarations")
        }))
    }

    fn get(&mut self, state: u32, id: String) -> wasmtime::Result<Option<Vec<u8>>> {
        self.op_state
            .get(state, &id)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn put(&mut self, state: u32, id: String, value: Vec<u8>) -> wasmtime::Result<()> {
        self.op_state
            .put(state, id, value)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn remove(&mut self, state: u32, id: String) -> wasmtime::Result<()> {
        self.op_state
            .remove(state, &id)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn entries(&mut self, state: u32) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        self.op_state
            .entries(state)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }
}
