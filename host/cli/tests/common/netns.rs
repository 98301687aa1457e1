//! A small network for cluster tests: a bridge in the root namespace carrying the
//! coordinator's address, and one network namespace per node joined to it by a veth pair,
//! so that one node's link can be cut (its root-side veth set down) while every process
//! keeps running. Needs root and iproute2 (`ip`).
//!
//! Addresses are `10.77.S.1/24` for the coordinator (on the bridge) and `10.77.S.(10+N)/24`
//! for node N, with `S` a subnet no interface of this machine uses yet. Names carry the
//! test process's id (`nps<pid>` for the bridge, `nps<pid>r<N>` / `nps<pid>n<N>` for the
//! root and node sides of node N's veth pair, `nps<pid>-n<N>` for its namespace), so
//! concurrent runs do not collide; leftovers of the same names are removed first, and
//! everything is removed on drop, also when the test fails.

use super::cluster::{Layout, NodeSite};
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `ip ARGS` and returns its stdout.
fn ip_output(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (install iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The bridge, the namespaces and the veth pairs of one test; removed on drop.
#[derive(Debug)]
pub struct Netns {
    tag: String,
    subnet: u8,
    nodes: u32,
    /// The coordinator runs in a namespace of its own too (at `10.77.S.2`).
    coordinator_ns: bool,
}

impl Netns {
    /// Builds the network for `nodes` nodes.
    ///
    /// # Errors
    /// What `ip` said when a step failed (not root, no iproute2, no veth or bridge
    /// support); whatever was made is removed.
    pub fn new(nodes: u32) -> Result<Netns, String> {
        Netns::build_with(nodes, false)
    }

    /// As [`Self::new`], with the coordinator in a namespace of its own (`10.77.S.2`, its
    /// veth pair `nps<pid>rc` / `nps<pid>nc`): every process of the cluster then has its
    /// own network, and the bridge's address (`10.77.S.1`, [`Self::host_ip`]) is the root
    /// namespace's, where the tests serve what every process reaches (the object store, the
    /// database).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn with_coordinator(nodes: u32) -> Result<Netns, String> {
        Netns::build_with(nodes, true)
    }

    fn build_with(nodes: u32, coordinator_ns: bool) -> Result<Netns, String> {
        let pid = std::process::id();
        let mut net = Netns {
            tag: format!("nps{pid}"),
            subnet: 0,
            nodes,
            coordinator_ns,
        };
        // Leftovers of an earlier run that had this pid (a killed test leaves them).
        net.remove();
        let used = ip_output(&["-o", "-4", "addr", "show"])? + &ip_output(&["-4", "route"])?;
        net.subnet = (0..250u32)
            .map(|i| ((pid + i) % 250 + 1) as u8)
            .find(|s| !used.contains(&format!("10.77.{s}.")))
            .ok_or("no free 10.77.S.0/24 subnet on this machine")?;
        if let Err(e) = net.build() {
            net.remove();
            return Err(e);
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        self.tag.clone()
    }

    /// Node `id`'s namespace.
    pub fn namespace(&self, id: u32) -> String {
        format!("{}-n{id}", self.tag)
    }

    /// The root-namespace side of node `id`'s veth pair (on the bridge).
    pub fn veth_root(&self, id: u32) -> String {
        format!("{}r{id}", self.tag)
    }

    fn veth_node(&self, id: u32) -> String {
        format!("{}n{id}", self.tag)
    }

    /// The coordinator's address: on the bridge, or in its namespace.
    pub fn coordinator_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(
            10,
            77,
            self.subnet,
            if self.coordinator_ns { 2 } else { 1 },
        ))
    }

    /// The root namespace's address on the bridge: every namespace reaches it.
    pub fn host_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 77, self.subnet, 1))
    }

    /// The coordinator's namespace (with [`Self::with_coordinator`]).
    pub fn coordinator_namespace(&self) -> String {
        format!("{}-c", self.tag)
    }

    /// Node `id`'s address, in its namespace.
    pub fn node_ip(&self, id: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 77, self.subnet, 10 + id as u8))
    }

    /// The namespaces to build: each node's, and the coordinator's if it has one, with
    /// their veth names and addresses.
    fn sites(&self) -> Vec<(String, String, String, IpAddr)> {
        let mut out: Vec<(String, String, String, IpAddr)> = (1..=self.nodes)
            .map(|id| {
                (
                    self.namespace(id),
                    self.veth_root(id),
                    self.veth_node(id),
                    self.node_ip(id),
                )
            })
            .collect();
        if self.coordinator_ns {
            out.push((
                self.coordinator_namespace(),
                format!("{}rc", self.tag),
                format!("{}nc", self.tag),
                self.coordinator_ip(),
            ));
        }
        out
    }

    fn build(&self) -> Result<(), String> {
        let bridge = self.bridge();
        let cidr = format!("{}/24", self.host_ip());
        ip(&["link", "add", "name", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &cidr, "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for (ns, root, node, addr) in self.sites() {
            let cidr = format!("{addr}/24");
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &root, "type", "veth", "peer", "name", &node, "netns", &ns,
            ])?;
            ip(&["link", "set", &root, "master", &bridge])?;
            ip(&["link", "set", &root, "up"])?;
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", &node])?;
            ip(&["-n", &ns, "link", "set", &node, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Removes whatever exists of this network (errors ignored: parts may be missing).
    fn remove(&self) {
        for (ns, root, _, _) in self.sites() {
            // Deleting one side of a veth pair deletes both.
            let _ = ip(&["link", "del", &root]);
            let _ = ip(&["netns", "del", &ns]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }

    /// Where the cluster's processes run: the coordinator on the bridge's address, node N
    /// under `ip netns exec` in its namespace, listening on its address.
    pub fn layout(&self) -> Layout {
        Layout {
            coordinator_ip: self.coordinator_ip(),
            coordinator_prefix: if self.coordinator_ns {
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    self.coordinator_namespace(),
                ]
            } else {
                Vec::new()
            },
            storage: None,
            nodes: (1..=self.nodes)
                .map(|id| NodeSite {
                    prefix: vec![
                        "ip".into(),
                        "netns".into(),
                        "exec".into(),
                        self.namespace(id),
                    ],
                    listen: format!("{}:0", self.node_ip(id)),
                })
                .collect(),
        }
    }

    /// Cuts (`up == false`) or restores node `id`'s link: its root-side veth goes down or
    /// up. While it is down every packet to or from the node is lost.
    pub fn set_link(&self, id: u32, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.veth_root(id), state])
            .unwrap_or_else(|e| panic!("setting node-{id}'s link {state}: {e}"));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
        // Say so if something stayed behind.
        let ours: Vec<String> = std::iter::once(self.bridge())
            .chain(self.sites().into_iter().map(|(_, root, _, _)| root))
            .collect();
        let left: Vec<String> = ip_output(&["-o", "link", "show"])
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_owned())
            .filter(|name| ours.contains(name))
            .collect();
        if !left.is_empty() {
            eprintln!("[cluster suite] network links left behind: {left:?}");
        }
    }
}
