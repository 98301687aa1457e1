//! Wire types between the coordinator role and the tasks (design §2.5): what a coordinator
//! deploys ([`Deployment`], [`TaskAssignment`] with its [`TaskRestorePlan`]), what it tells
//! a running task ([`TaskCommand`]), what a task reports ([`TaskEvent`]), and what travels
//! on a data channel ([`Message`] behind a [`StreamHeader`]).
//!
//! Every type is plain serializable data, so the embedded mode passes them between threads
//! and the cluster mode sends them over QUIC with the size-capped codecs of [`codec`]. A
//! task reads its own restore segments from checkpoint storage: the control plane carries
//! segment descriptors, never state payloads (design §2.5).
//!
//! This crate has no I/O and depends on neither wasmtime nor a transport.

pub mod cli;
pub mod codec;
mod control;
mod data;
pub mod session;

pub use codec::{CodecError, decode, encode};
pub use control::*;
pub use data::*;
