//! Shared harness of the process suites. [`job`]: a job run as `nopstream run` processes,
//! killed and restarted (crash, JetStream). The cluster suites (`cluster`,
//! `cluster_partition`): a coordinator and
//! node processes of the `nopstream` binary, the flights jobs they run and the checks of
//! their output ([`cluster`]), and network namespaces to put nodes in ([`netns`]).

#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod job;
pub mod netns;
