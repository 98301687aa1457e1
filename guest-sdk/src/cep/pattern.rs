//! The Pattern API: stages, contiguity, quantifiers, named conditions, `within` and the
//! after-match skip strategy, plus the serializable model (design §9.2: the pattern model is
//! operator metadata and enters the plan fingerprint).

use crate::{PluginError, Result};

use super::MatchSoFar;

/// A named condition: `(event, events matched so far) -> accepted`.
pub(crate) type CondFn<E> = Box<dyn Fn(&E, &MatchSoFar<'_, E>) -> bool>;

/// How a stage's events relate to the events taken before them (Flink CEP's contiguity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contiguity {
    /// The event must directly follow the previously taken event of the same key
    /// (`next`, `consecutive`): any other event in between kills the partial match.
    Strict,
    /// Non-matching events in between are ignored; a partial match takes the first matching
    /// event only (`followed_by`, "skip till next match").
    Relaxed,
    /// Every matching event is taken *and* also skipped, so later matching events start
    /// further branches (`followed_by_any`, `allow_combinations`, "skip till any match").
    NonDeterministic,
}

impl Contiguity {
    fn as_str(self) -> &'static str {
        match self {
            Contiguity::Strict => "strict",
            Contiguity::Relaxed => "relaxed",
            Contiguity::NonDeterministic => "non_deterministic",
        }
    }
}

/// Whether a stage takes events or forbids them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageKind {
    /// A stage whose events are part of the match.
    Positive,
    /// `not_next`: the event right after the previous stage's last event must not match.
    NotNext,
    /// `not_followed_by`: no matching event may occur between the previous stage and the
    /// next positive stage (or, as the last stage, before `within` runs out).
    NotFollowedBy,
}

impl StageKind {
    fn as_str(self) -> &'static str {
        match self {
            StageKind::Positive => "positive",
            StageKind::NotNext => "not_next",
            StageKind::NotFollowedBy => "not_followed_by",
        }
    }
}

/// What to discard after a match is emitted (Flink's `AfterMatchSkipStrategy`).
///
/// Events are numbered per key in processing (event-time) order. After a match `M` is
/// emitted, every partial match — and every other match completed by the same event but
/// not yet emitted — whose *first* event number is at or before the pruning point is
/// discarded:
///
/// | strategy | discards partial matches starting … |
/// |---|---|
/// | `NoSkip` | nothing is discarded (default) |
/// | `SkipToNext` | at or before `M`'s first event |
/// | `SkipPastLastEvent` | at or before `M`'s last event (no two emitted matches overlap) |
/// | `SkipToFirst(s)` | strictly before the first event of stage `s` in `M` |
/// | `SkipToLast(s)` | strictly before the last event of stage `s` in `M` |
///
/// If stage `s` has no event in `M` (an optional stage), `SkipToFirst` / `SkipToLast`
/// discard nothing. Matches completed by the same event are emitted in order of their
/// first event, then of creation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum AfterMatchSkip {
    /// Keep every partial match.
    #[default]
    NoSkip,
    /// Discard partial matches that started with (or before) the match's first event.
    SkipToNext,
    /// Discard partial matches that started at or before the match's last event.
    SkipPastLastEvent,
    /// Discard partial matches that started before the first event of the named stage.
    SkipToFirst(String),
    /// Discard partial matches that started before the last event of the named stage.
    SkipToLast(String),
}

/// Boolean combination of named conditions; leaves index [`Pattern`]'s condition list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CondExpr {
    /// No `where_` yet: every event matches.
    True,
    Leaf(usize),
    And(Box<CondExpr>, Box<CondExpr>),
    Or(Box<CondExpr>, Box<CondExpr>),
}

/// One stage of a pattern.
#[derive(Debug, Clone)]
pub(crate) struct Stage {
    pub name: String,
    pub kind: StageKind,
    /// Contiguity towards the events taken before this stage's first event.
    pub contiguity: Contiguity,
    /// Contiguity between the events of a looping stage (`Relaxed` unless `consecutive`
    /// or `allow_combinations`).
    pub inner: Contiguity,
    /// Minimum number of events (≥ 1).
    pub min: u32,
    /// Maximum number of events; `None` = unbounded.
    pub max: Option<u32>,
    /// Whether the stage may take no event at all.
    pub optional: bool,
    pub cond: CondExpr,
    /// For looping stages: an event matching this ends the loop (not taken).
    pub until: Option<CondExpr>,
}

/// A CEP pattern over events of type `E`, built like Flink's `Pattern`:
///
/// ```
/// use nop_stream_sdk::cep::{AfterMatchSkip, Pattern};
/// let p = Pattern::<i64>::begin("low")
///     .where_("below_10", |v: &i64, _| *v < 10)
///     .next("rise")
///     .where_("above_previous", |v: &i64, m| m.last("low").is_some_and(|l| v > l))
///     .one_or_more()
///     .within(60_000)
///     .after_match(AfterMatchSkip::SkipPastLastEvent);
/// assert!(p.validate().is_ok());
/// assert!(p.to_model_json().contains("\"within_ms\":60000"));
/// ```
///
/// Builder methods after `begin` / `next` / `followed_by` / `not_*` apply to the stage
/// added last. Conditions carry names so that the pattern has a serializable model
/// ([`Pattern::to_model_json`]); two patterns with equal models must behave the same.
/// Check a pattern with [`Pattern::validate`] (the operator does so on open).
pub struct Pattern<E> {
    pub(crate) stages: Vec<Stage>,
    pub(crate) conditions: Vec<(String, CondFn<E>)>,
    pub(crate) within: Option<i64>,
    pub(crate) skip: AfterMatchSkip,
}

impl<E> std::fmt::Debug for Pattern<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_model_json())
    }
}

impl<E> Pattern<E> {
    fn stage(name: &str, kind: StageKind, contiguity: Contiguity) -> Stage {
        Stage {
            name: name.to_string(),
            kind,
            contiguity,
            inner: Contiguity::Relaxed,
            min: 1,
            max: Some(1),
            optional: false,
            cond: CondExpr::True,
            until: None,
        }
    }

    /// Starts a pattern with the first stage `name` (one event, any event until a
    /// `where_` is added). Default skip strategy: [`AfterMatchSkip::NoSkip`]; no `within`.
    pub fn begin(name: &str) -> Self {
        Pattern {
            stages: vec![Self::stage(name, StageKind::Positive, Contiguity::Relaxed)],
            conditions: Vec::new(),
            within: None,
            skip: AfterMatchSkip::NoSkip,
        }
    }

    fn push(mut self, name: &str, kind: StageKind, contiguity: Contiguity) -> Self {
        self.stages.push(Self::stage(name, kind, contiguity));
        self
    }

    /// Appends stage `name` with strict contiguity: its first event must directly follow
    /// the previous stage's last event.
    pub fn next(self, name: &str) -> Self {
        self.push(name, StageKind::Positive, Contiguity::Strict)
    }

    /// Appends stage `name` with relaxed contiguity (non-matching events in between are
    /// ignored; the first matching event is taken).
    pub fn followed_by(self, name: &str) -> Self {
        self.push(name, StageKind::Positive, Contiguity::Relaxed)
    }

    /// Appends stage `name` with non-deterministic relaxed contiguity (every later
    /// matching event is a candidate).
    pub fn followed_by_any(self, name: &str) -> Self {
        self.push(name, StageKind::Positive, Contiguity::NonDeterministic)
    }

    /// Appends a negative stage: the event directly after the previous stage's last event
    /// must not satisfy this stage's condition. May not be the last stage.
    pub fn not_next(self, name: &str) -> Self {
        self.push(name, StageKind::NotNext, Contiguity::Strict)
    }

    /// Appends a negative stage: no event satisfying its condition may occur before the
    /// next positive stage's first event. As the last stage it needs [`Pattern::within`]:
    /// the match then completes when `within` runs out without such an event (absence).
    pub fn not_followed_by(self, name: &str) -> Self {
        self.push(name, StageKind::NotFollowedBy, Contiguity::Relaxed)
    }

    fn last(&mut self) -> &mut Stage {
        self.stages.last_mut().expect("a pattern has a stage")
    }

    fn add_cond(&mut self, name: &str, f: CondFn<E>) -> CondExpr {
        self.conditions.push((name.to_string(), f));
        CondExpr::Leaf(self.conditions.len() - 1)
    }

    /// ANDs the named condition into the current stage's condition (Flink `where`).
    /// The condition sees the candidate event and the events already matched by the
    /// partial match ([`MatchSoFar`]), so it can compare with earlier stages.
    pub fn where_(
        mut self,
        name: &str,
        cond: impl Fn(&E, &MatchSoFar<'_, E>) -> bool + 'static,
    ) -> Self {
        let leaf = self.add_cond(name, Box::new(cond));
        let st = self.last();
        st.cond = match std::mem::replace(&mut st.cond, CondExpr::True) {
            CondExpr::True => leaf,
            c => CondExpr::And(Box::new(c), Box::new(leaf)),
        };
        self
    }

    /// ORs the named condition with the current stage's condition so far (Flink `or`):
    /// `where_(a).or(b).where_(c)` is `(a || b) && c`.
    pub fn or(
        mut self,
        name: &str,
        cond: impl Fn(&E, &MatchSoFar<'_, E>) -> bool + 'static,
    ) -> Self {
        let leaf = self.add_cond(name, Box::new(cond));
        let st = self.last();
        st.cond = match std::mem::replace(&mut st.cond, CondExpr::True) {
            CondExpr::True => CondExpr::True,
            c => CondExpr::Or(Box::new(c), Box::new(leaf)),
        };
        self
    }

    /// Stop condition of a looping stage: an event satisfying it ends the loop of a
    /// partial match (the event is not taken; matches that already left the loop go on).
    pub fn until(
        mut self,
        name: &str,
        cond: impl Fn(&E, &MatchSoFar<'_, E>) -> bool + 'static,
    ) -> Self {
        let leaf = self.add_cond(name, Box::new(cond));
        let st = self.last();
        st.until = Some(match st.until.take() {
            None => leaf,
            Some(c) => CondExpr::Or(Box::new(c), Box::new(leaf)),
        });
        self
    }

    /// The current stage takes exactly `n` events (n ≥ 1).
    pub fn times(self, n: u32) -> Self {
        self.times_range(n, n)
    }

    /// The current stage takes `from..=to` events (1 ≤ from ≤ to).
    pub fn times_range(mut self, from: u32, to: u32) -> Self {
        let st = self.last();
        st.min = from;
        st.max = Some(to);
        self
    }

    /// The current stage takes one or more events (a looping stage).
    pub fn one_or_more(self) -> Self {
        self.times_or_more(1)
    }

    /// The current stage takes `n` or more events (n ≥ 1).
    pub fn times_or_more(mut self, n: u32) -> Self {
        let st = self.last();
        st.min = n;
        st.max = None;
        self
    }

    /// The current stage may also take no event at all.
    pub fn optional(mut self) -> Self {
        self.last().optional = true;
        self
    }

    /// Events of the current (looping) stage must be strictly contiguous.
    pub fn consecutive(mut self) -> Self {
        self.last().inner = Contiguity::Strict;
        self
    }

    /// Events of the current (looping) stage use non-deterministic relaxed contiguity.
    pub fn allow_combinations(mut self) -> Self {
        self.last().inner = Contiguity::NonDeterministic;
        self
    }

    /// Limits a match to `ms` milliseconds of event time from its first event: a partial
    /// match is pruned (and reported as timed out) when event time reaches
    /// `first_ts + ms`, so every event of a match has `ts - first_ts < ms` (Flink's rule
    /// `timestamp - startTimestamp >= windowTime` ⇒ timed out). Applies to the whole
    /// pattern; a later call replaces an earlier one.
    pub fn within(mut self, ms: i64) -> Self {
        self.within = Some(ms);
        self
    }

    /// Sets the after-match skip strategy (default [`AfterMatchSkip::NoSkip`]).
    pub fn after_match(mut self, skip: AfterMatchSkip) -> Self {
        self.skip = skip;
        self
    }

    /// The `within` window in ms, if any.
    pub fn within_ms(&self) -> Option<i64> {
        self.within
    }

    /// The after-match skip strategy.
    pub fn skip_strategy(&self) -> &AfterMatchSkip {
        &self.skip
    }

    /// Names of the positive stages, in pattern order (the stages a [`super::Match`]
    /// reports).
    pub fn stage_names(&self) -> Vec<&str> {
        self.stages
            .iter()
            .filter(|s| s.kind == StageKind::Positive)
            .map(|s| s.name.as_str())
            .collect()
    }

    /// Checks the pattern's structure.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] naming the offending stage when: a stage name is
    /// empty or repeated; more than 65 535 stages; the first stage is negative or
    /// optional; a quantifier has `from == 0` or `from > to`; a negative stage is
    /// quantified or optional; the pattern ends with `not_next`, or with
    /// `not_followed_by` without `within`; `within <= 0`; a skip strategy names no
    /// positive stage.
    pub fn validate(&self) -> Result<()> {
        let err = |m: String| Err(PluginError::invalid_config(format!("CEP pattern: {m}")));
        if self.stages.len() > usize::from(u16::MAX) {
            return err(format!("{} stages, at most 65535", self.stages.len()));
        }
        for (i, s) in self.stages.iter().enumerate() {
            if s.name.is_empty() {
                return err(format!("stage {i} has an empty name"));
            }
            if self.stages[..i].iter().any(|o| o.name == s.name) {
                return err(format!("stage name {:?} is used twice", s.name));
            }
            if s.min == 0 || s.max.is_some_and(|m| m < s.min) {
                return err(format!(
                    "stage {:?}: quantifier {}..={:?} (need 1 <= from <= to; use optional() for zero)",
                    s.name, s.min, s.max
                ));
            }
            if s.kind != StageKind::Positive
                && (s.optional || s.min != 1 || s.max != Some(1) || s.until.is_some())
            {
                return err(format!(
                    "negative stage {:?} cannot be quantified, optional or have until",
                    s.name
                ));
            }
        }
        let first = &self.stages[0];
        if first.kind != StageKind::Positive || first.optional {
            return err(format!(
                "the first stage {:?} must be positive and not optional",
                first.name
            ));
        }
        let last = self.stages.last().expect("non-empty");
        match last.kind {
            StageKind::NotNext => {
                return err(format!(
                    "the pattern ends with not_next({:?}); use not_followed_by(..).within(..)",
                    last.name
                ));
            }
            StageKind::NotFollowedBy if self.within.is_none() => {
                return err(format!(
                    "the pattern ends with not_followed_by({:?}) but has no within",
                    last.name
                ));
            }
            _ => {}
        }
        if let Some(w) = self.within
            && w <= 0
        {
            return err(format!("within must be positive, got {w} ms"));
        }
        if let AfterMatchSkip::SkipToFirst(n) | AfterMatchSkip::SkipToLast(n) = &self.skip
            && !self
                .stages
                .iter()
                .any(|s| &s.name == n && s.kind == StageKind::Positive)
        {
            return err(format!("skip strategy names unknown positive stage {n:?}"));
        }
        Ok(())
    }

    /// The pattern's model as compact JSON with a fixed field order:
    ///
    /// ```text
    /// {"type":"cep","version":1,"stages":[{"name":..,"kind":"positive|not_next|not_followed_by",
    ///   "contiguity":"strict|relaxed|non_deterministic","min":1,"max":1|null,
    ///   "optional":false,"inner":"relaxed","condition":<cond>,"until":<cond>|null},..],
    ///  "within_ms":<ms>|null,"skip":{"strategy":"no_skip|skip_to_next|
    ///   skip_past_last_event|skip_to_first|skip_to_last","stage":<name>|null}}
    /// ```
    ///
    /// where `<cond>` is `true`, a condition name as a string, `{"and":[c,c]}` or
    /// `{"or":[c,c]}`. Return it from `describe()` with [`crate::PluginInfo::model`]
    /// (design §9.2: the pattern model enters the plan fingerprint).
    pub fn to_model_json(&self) -> String {
        let mut o = String::from(r#"{"type":"cep","version":1,"stages":["#);
        for (i, s) in self.stages.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            o.push_str(r#"{"name":"#);
            json_str(&mut o, &s.name);
            o.push_str(&format!(
                r#","kind":"{}","contiguity":"{}","min":{},"max":{},"optional":{},"inner":"{}","condition":"#,
                s.kind.as_str(),
                s.contiguity.as_str(),
                s.min,
                s.max.map_or("null".to_string(), |m| m.to_string()),
                s.optional,
                s.inner.as_str()
            ));
            self.cond_json(&mut o, &s.cond);
            o.push_str(r#","until":"#);
            match &s.until {
                None => o.push_str("null"),
                Some(c) => self.cond_json(&mut o, c),
            }
            o.push('}');
        }
        o.push_str(r#"],"within_ms":"#);
        o.push_str(&self.within.map_or("null".to_string(), |w| w.to_string()));
        let (strategy, stage) = match &self.skip {
            AfterMatchSkip::NoSkip => ("no_skip", None),
            AfterMatchSkip::SkipToNext => ("skip_to_next", None),
            AfterMatchSkip::SkipPastLastEvent => ("skip_past_last_event", None),
            AfterMatchSkip::SkipToFirst(s) => ("skip_to_first", Some(s)),
            AfterMatchSkip::SkipToLast(s) => ("skip_to_last", Some(s)),
        };
        o.push_str(&format!(r#","skip":{{"strategy":"{strategy}","stage":"#));
        match stage {
            None => o.push_str("null"),
            Some(s) => json_str(&mut o, s),
        }
        o.push_str("}}");
        o
    }

    fn cond_json(&self, o: &mut String, c: &CondExpr) {
        match c {
            CondExpr::True => o.push_str("true"),
            CondExpr::Leaf(i) => json_str(o, &self.conditions[*i].0),
            CondExpr::And(a, b) | CondExpr::Or(a, b) => {
                o.push_str(if matches!(c, CondExpr::And(..)) {
                    r#"{"and":["#
                } else {
                    r#"{"or":["#
                });
                self.cond_json(o, a);
                o.push(',');
                self.cond_json(o, b);
                o.push_str("]}");
            }
        }
    }

    pub(crate) fn eval(&self, c: &CondExpr, e: &E, m: &MatchSoFar<'_, E>) -> bool {
        match c {
            CondExpr::True => true,
            CondExpr::Leaf(i) => (self.conditions[*i].1)(e, m),
            CondExpr::And(a, b) => self.eval(a, e, m) && self.eval(b, e, m),
            CondExpr::Or(a, b) => self.eval(a, e, m) || self.eval(b, e, m),
        }
    }
}

/// Appends `s` as a JSON string literal.
fn json_str(o: &mut String, s: &str) {
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
}
