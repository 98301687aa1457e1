use super::*;
use nop_stream_api::{JobId, PipelineId, SubtaskIndex, VertexId};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn task(i: u32) -> TaskId {
    TaskId {
        job: JobId::new("j"),
        pipeline: PipelineId::new("p"),
        vertex: VertexId::new(if i < 2 { "src" } else { "agg" }),
        subtask: SubtaskIndex(i),
    }
}

fn snap(t: u32, epoch: u64) -> Box<TaskSnapshot> {
    Box::new(TaskSnapshot {
        task: task(t),
        epoch: EpochId(epoch),
        end_of_data: false,
        segments: Vec::new(),
        operator_state: Vec::new(),
        splits: Vec::new(),
        watermarks: Vec::new(),
        ended_inputs: Vec::new(),
        pending_transactions: Vec::new(),
        sink_operator: None,
        snapshot_bytes: 0,
        alignment_ms: 0,
        duration_ms: 0,
        async_ms: 0,
        barrier_unix_ms: 0,
        compacted_bytes: 0,
        records_in_total: 0,
        records_out_total: 0,
    })
}

fn coord() -> EpochCoordinator {
    EpochCoordinator::new(
        (0..4).map(task),
        AttemptId(2),
        EpochId(10),
        Some(1000),
        5000,
        None,
    )
}

fn ack(c: &mut EpochCoordinator, attempt: u32, t: u32, e: u64) -> Vec<Command> {
    c.handle(Event::Ack {
        attempt: AttemptId(attempt),
        snapshot: snap(t, e),
    })
}

#[test]
fn epochs_follow_the_interval_and_complete_in_order() {
    let mut c = coord();
    assert!(
        c.handle(Event::Tick { now_ms: 0 }).is_empty(),
        "the first interval counts from the first tick"
    );
    assert!(c.handle(Event::Tick { now_ms: 999 }).is_empty());
    assert_eq!(
        c.handle(Event::Tick { now_ms: 1000 }),
        vec![Command::InjectBarrier {
            epoch: EpochId(10),
            final_epoch: false
        }]
    );
    // One epoch in flight: no new epoch while 10 is pending.
    assert!(c.handle(Event::Tick { now_ms: 2500 }).is_empty());
    for t in 0..3 {
        assert!(ack(&mut c, 2, t, 10).is_empty());
    }
    let cmds = ack(&mut c, 2, 3, 10);
    assert!(
        matches!(&cmds[..], [Command::PublishManifest { epoch: EpochId(10), snapshots, .. }] if snapshots.len() == 4)
    );
    assert_eq!(c.in_flight(), Some((EpochId(10), EpochState::Precommitted)));
    // Commit only after the manifest is durable.
    assert_eq!(
        c.handle(Event::ManifestDurable { epoch: EpochId(10) }),
        vec![Command::Commit { epoch: EpochId(10) }]
    );
    assert_eq!(c.latest_durable(), Some(EpochId(10)));
    assert!(
        c.handle(Event::SinksCommitted { epoch: EpochId(10) })
            .is_empty()
    );
    assert_eq!(c.latest_committed(), Some(EpochId(10)));
    assert_eq!(
        c.handle(Event::Tick { now_ms: 2600 }),
        vec![Command::InjectBarrier {
            epoch: EpochId(11),
            final_epoch: false
        }]
    );
}

/// A recovered attempt's first epoch waited a whole interval after its deployment, so
/// its sinks' output stayed uncommitted up to a second longer than needed (node loss to
/// first commit: 885 ms of 3.8 s). With a first interval, the first epoch starts that long
/// after the first tick; later ones keep the interval, counted from the epoch's start.
#[test]
fn a_first_interval_starts_the_first_epoch_early_and_only_the_first() {
    let barrier = |e: u64| Command::InjectBarrier {
        epoch: EpochId(e),
        final_epoch: false,
    };
    let mut c = coord().with_first_interval_ms(100);
    assert!(c.handle(Event::Tick { now_ms: 5 }).is_empty());
    assert!(c.handle(Event::Tick { now_ms: 104 }).is_empty());
    assert_eq!(c.handle(Event::Tick { now_ms: 105 }), vec![barrier(10)]);
    for t in 0..4 {
        ack(&mut c, 2, t, 10);
    }
    c.handle(Event::ManifestDurable { epoch: EpochId(10) });
    c.handle(Event::SinksCommitted { epoch: EpochId(10) });
    assert!(
        c.handle(Event::Tick { now_ms: 1104 }).is_empty(),
        "one interval after 105"
    );
    assert_eq!(c.handle(Event::Tick { now_ms: 1105 }), vec![barrier(11)]);
    // Never later than the interval itself, and 0 starts at the first tick.
    let mut c = coord().with_first_interval_ms(60_000);
    assert!(c.handle(Event::Tick { now_ms: 0 }).is_empty());
    assert_eq!(c.handle(Event::Tick { now_ms: 1000 }), vec![barrier(10)]);
    let mut c = coord().with_first_interval_ms(0);
    assert_eq!(c.handle(Event::Tick { now_ms: 7 }), vec![barrier(10)]);
    // Without a periodic interval it does nothing.
    let mut c = EpochCoordinator::new(
        (0..4).map(task),
        AttemptId(2),
        EpochId(10),
        None,
        5000,
        None,
    )
    .with_first_interval_ms(100);
    assert!(c.handle(Event::Tick { now_ms: 0 }).is_empty());
    assert!(c.handle(Event::Tick { now_ms: 500 }).is_empty());
}

#[test]
fn stale_attempt_ack_never_completes_an_epoch() {
    // Regression: an ACK of a fenced attempt must not count toward the ACK set.
    let mut c = coord();
    c.handle(Event::Trigger { now_ms: 0 });
    for t in 0..3 {
        ack(&mut c, 2, t, 10);
    }
    assert!(ack(&mut c, 1, 3, 10).is_empty(), "attempt 1 is fenced");
    assert_eq!(c.stats().fenced_acks, 1);
    assert_eq!(c.in_flight(), Some((EpochId(10), EpochState::Snapshotting)));
    assert!(matches!(
        ack(&mut c, 2, 3, 10)[..],
        [Command::PublishManifest { .. }]
    ));
}

#[test]
fn duplicate_and_wrong_epoch_acks_are_ignored() {
    let mut c = coord();
    c.handle(Event::Trigger { now_ms: 0 });
    ack(&mut c, 2, 0, 10);
    assert!(ack(&mut c, 2, 0, 10).is_empty());
    assert!(ack(&mut c, 2, 1, 9).is_empty());
    assert!(ack(&mut c, 2, 1, 11).is_empty());
    assert_eq!(c.stats().ignored_acks, 3);
    ack(&mut c, 2, 1, 10);
    ack(&mut c, 2, 2, 10);
    assert!(!ack(&mut c, 2, 3, 10).is_empty());
    // An ACK after completion changes nothing.
    assert!(ack(&mut c, 2, 3, 10).is_empty());
    // A durable report for another epoch is ignored.
    assert!(
        c.handle(Event::ManifestDurable { epoch: EpochId(9) })
            .is_empty()
    );
}

#[test]
fn timeout_aborts_and_the_job_continues() {
    let mut c = coord();
    c.handle(Event::Trigger { now_ms: 0 });
    ack(&mut c, 2, 0, 10);
    let cmds = c.handle(Event::Tick { now_ms: 5001 });
    assert!(matches!(
        &cmds[0],
        Command::Abort {
            epoch: EpochId(10),
            ..
        }
    ));
    // The same tick may start the next epoch (the interval passed).
    assert_eq!(
        cmds[1],
        Command::InjectBarrier {
            epoch: EpochId(11),
            final_epoch: false
        }
    );
    // Late ACKs of the aborted epoch are ignored.
    for t in 1..4 {
        assert!(ack(&mut c, 2, t, 10).is_empty());
    }
    assert_eq!(c.stats().aborted, 1);
}

#[test]
fn decline_aborts_the_epoch() {
    let mut c = coord();
    c.handle(Event::Trigger { now_ms: 0 });
    let cmds = c.handle(Event::Decline {
        attempt: AttemptId(2),
        task: task(1),
        epoch: EpochId(10),
        reason: "busy".into(),
    });
    assert!(matches!(
        &cmds[..],
        [Command::Abort {
            epoch: EpochId(10),
            ..
        }]
    ));
}

#[test]
fn end_of_data_leads_to_a_final_epoch_then_finish() {
    let mut c = EpochCoordinator::new((0..4).map(task), AttemptId(1), EpochId(1), None, 5000, None);
    for t in 0..3 {
        c.handle(Event::EndOfData {
            attempt: AttemptId(1),
            task: task(t),
        });
    }
    // A stale attempt's end of data does not count.
    c.handle(Event::EndOfData {
        attempt: AttemptId(0),
        task: task(3),
    });
    assert!(c.handle(Event::Tick { now_ms: 10 }).is_empty());
    c.handle(Event::EndOfData {
        attempt: AttemptId(1),
        task: task(3),
    });
    assert_eq!(
        c.handle(Event::Tick { now_ms: 20 }),
        vec![Command::InjectBarrier {
            epoch: EpochId(1),
            final_epoch: true
        }]
    );
    for t in 0..4 {
        ack(&mut c, 1, t, 1);
    }
    assert_eq!(
        c.handle(Event::ManifestDurable { epoch: EpochId(1) }),
        vec![Command::Commit { epoch: EpochId(1) }]
    );
    assert_eq!(
        c.handle(Event::SinksCommitted { epoch: EpochId(1) }),
        vec![Command::Finish]
    );
    assert!(c.is_finished());
    assert!(c.handle(Event::Tick { now_ms: 99_999 }).is_empty());
}

#[derive(Debug, Clone)]
enum Ev {
    Tick(u64),
    Trigger,
    Ack {
        attempt: u32,
        task: u32,
        epoch_offset: i64,
    },
    Durable {
        epoch_offset: i64,
    },
    Committed {
        epoch_offset: i64,
    },
    EndOfData(u32),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u64..3000).prop_map(Ev::Tick),
        Just(Ev::Trigger),
        (1u32..4, 0u32..5, -2i64..2).prop_map(|(attempt, task, epoch_offset)| Ev::Ack {
            attempt,
            task,
            epoch_offset
        }),
        (-1i64..1).prop_map(|epoch_offset| Ev::Durable { epoch_offset }),
        (-1i64..1).prop_map(|epoch_offset| Ev::Committed { epoch_offset }),
        (0u32..4).prop_map(Ev::EndOfData),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Under reordered, duplicate, stale-attempt and unknown-task messages: epochs are
    /// strictly increasing, at most one is in flight, a manifest is published only when
    /// each ACK-set task acknowledged that epoch in the current attempt, and commits
    /// follow durability.
    #[test]
    fn protocol_invariants_hold(events in proptest::collection::vec(ev(), 1..200)) {
        let current = 2u32;
        let mut c = EpochCoordinator::new((0..4).map(task), AttemptId(current), EpochId(1), Some(500), 2000, None);
        let mut now = 0u64;
        let mut last_injected: Option<EpochId> = None;
        let mut open: Option<EpochId> = None; // injected, not yet durable or aborted
        let mut valid_acks: BTreeMap<EpochId, BTreeSet<u32>> = BTreeMap::new();
        let mut durable: BTreeSet<EpochId> = BTreeSet::new();
        for e in events {
            let event = match e {
                Ev::Tick(dt) => { now += dt; Event::Tick { now_ms: now } }
                Ev::Trigger => Event::Trigger { now_ms: now },
                Ev::Ack { attempt, task: t, epoch_offset } => {
                    let base = open.or(last_injected).map_or(1, |e| e.0 as i64);
                    let epoch = EpochId((base + epoch_offset).max(0) as u64);
                    if attempt == current && t < 4 && Some(epoch) == open {
                        valid_acks.entry(epoch).or_default().insert(t);
                    }
                    Event::Ack { attempt: AttemptId(attempt), snapshot: snap(t, epoch.0) }
                }
                Ev::Durable { epoch_offset } => {
                    let base = open.or(last_injected).map_or(1, |e| e.0 as i64);
                    Event::ManifestDurable { epoch: EpochId((base + epoch_offset).max(0) as u64) }
                }
                Ev::Committed { epoch_offset } => {
                    let base = last_injected.map_or(1, |e| e.0 as i64);
                    Event::SinksCommitted { epoch: EpochId((base + epoch_offset).max(0) as u64) }
                }
                Ev::EndOfData(t) => Event::EndOfData { attempt: AttemptId(current), task: task(t) },
            };
            let was_durable = match &event { Event::ManifestDurable { epoch } => Some(*epoch), _ => None };
            for cmd in c.handle(event) {
                match cmd {
                    Command::InjectBarrier { epoch, .. } => {
                        prop_assert!(open.is_none(), "epoch {epoch:?} injected while {open:?} in flight");
                        prop_assert!(last_injected.is_none_or(|l| epoch > l), "epochs must increase");
                        last_injected = Some(epoch);
                        open = Some(epoch);
                    }
                    Command::PublishManifest { epoch, snapshots, .. } => {
                        prop_assert_eq!(Some(epoch), open);
                        let acked = valid_acks.get(&epoch).cloned().unwrap_or_default();
                        prop_assert_eq!(acked.len(), 4, "published without all current-attempt ACKs");
                        prop_assert_eq!(snapshots.len(), 4);
                        prop_assert!(snapshots.iter().all(|s| s.epoch == epoch));
                    }
                    Command::Commit { epoch } => {
                        prop_assert_eq!(was_durable, Some(epoch), "commit must follow its own durability");
                        durable.insert(epoch);
                        open = None;
                    }
                    Command::Abort { epoch, .. } => {
                        prop_assert_eq!(Some(epoch), open);
                        open = None;
                    }
                    Command::Finish => {
                        prop_assert!(c.is_finished());
                    }
                }
            }
            if let Some(committed) = c.latest_committed() {
                prop_assert!(durable.iter().any(|d| *d >= committed), "committed beyond durable");
            }
        }
    }
}
