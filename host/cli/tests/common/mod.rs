//! Shared harness of the cluster suites: a coordinator and node processes of the
//! `nopstream` binary, the flights jobs they run and the checks of their output
//! ([`cluster`]).

#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
