//! Shared harness of the suites: the repository root, the binary, process output and
//! committed lines ([`kit`]); the flights data and independent expectations
//! ([`flights`]), running and crashing jobs through the binary ([`job`]: the crash,
//! JetStream, Redis and queue-to-postgres suites), and, for the cluster suites (`cluster`,
//! `cluster_partition`): a coordinator and node processes of the `nopstream` binary, the
//! flights jobs they run and the checks of their output ([`cluster`]), and network
//! namespaces to put nodes in ([`netns`]); directory snapshots and copies and the
//! blackhole sink's committed totals ([`files`]).

#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod files;
pub mod flights;
pub mod forward;
pub mod job;
pub mod kit;
pub mod netns;
pub mod pg;
pub mod tls;
