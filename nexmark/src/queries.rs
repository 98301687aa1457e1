//! The queries in plain Rust over the whole (bounded) input: what each nop-stream job
//! must commit, and the benchmark's native floor. Each returns its output lines, in no
//! particular order (compare sorted).
//!
//! Semantics are those of the nexmark repository's Flink SQL (`queries/q*.sql`), in the
//! append-only forms the nop-stream jobs emit:
//!
//! | query | output line | notes |
//! |---|---|---|
//! | q0 | `auction,bidder,price,date_time,extra` | every bid |
//! | q1 | `auction,bidder,price_eur,date_time,extra` | `0.908 * price` with 3 decimals |
//! | q2 | `auction,price` | bids with `auction mod 123 = 0` |
//! | q3 | `name,city,state,auction_id` | auctions of category 10 joined to their seller in OR, ID or CA |
//! | q4 | `category,average` | see [`q4`] |
//! | q5 | `window_start,window_end,auction,bids` | every auction with the most bids per 10 s window sliding by 2 s; ties: all of them, as the SQL's `num >= maxn` |
//! | q7 | `auction,price,bidder,date_time,extra` | bids at their 10 s tumbling window's highest price, `date_time` in `[end - 10 s, end]` |
//! | q8 | `id,name,window_start` | persons who opened an auction in the 10 s tumbling window they registered in |
//! | q9 | the auction's 10 columns, then `auction,bidder,price,bid_date_time,bid_extra` | see [`q9`] |
//! | q11 | `bidder,bids,session_start,session_end` | bids per bidder session, gap 10 s; sessions merge only when they overlap |

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use crate::{Auction, Bid, Person, csv};

/// A query of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Query {
    /// Pass-through.
    Q0,
    /// Currency conversion.
    Q1,
    /// Selection.
    Q2,
    /// Local item suggestion (regular join).
    Q3,
    /// Average price per category (interval join, then an aggregate).
    Q4,
    /// Hot items (sliding windows).
    Q5,
    /// Highest bid (tumbling window, then an interval join).
    Q7,
    /// Monitor new users (window join).
    Q8,
    /// Winning bids (interval join, top 1).
    Q9,
    /// User sessions (session windows).
    Q11,
}

impl Query {
    /// Every query, in order.
    pub const ALL: [Query; 10] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q7,
        Query::Q8,
        Query::Q9,
        Query::Q11,
    ];

    /// `q0`, `q1`, ...
    pub const fn name(self) -> &'static str {
        match self {
            Query::Q0 => "q0",
            Query::Q1 => "q1",
            Query::Q2 => "q2",
            Query::Q3 => "q3",
            Query::Q4 => "q4",
            Query::Q5 => "q5",
            Query::Q7 => "q7",
            Query::Q8 => "q8",
            Query::Q9 => "q9",
            Query::Q11 => "q11",
        }
    }

    /// The query named `s`.
    pub fn parse(s: &str) -> Option<Query> {
        Query::ALL.into_iter().find(|q| q.name() == s)
    }

    /// Which inputs it reads: (persons, auctions, bids).
    pub const fn inputs(self) -> (bool, bool, bool) {
        match self {
            Query::Q3 | Query::Q8 => (true, true, false),
            Query::Q4 | Query::Q9 => (false, true, true),
            _ => (false, false, true),
        }
    }

    /// The query's output lines for the whole input.
    pub fn run(self, persons: &[Person], auctions: &[Auction], bids: &[Bid]) -> Vec<String> {
        match self {
            Query::Q0 => q0(bids),
            Query::Q1 => q1(bids),
            Query::Q2 => q2(bids),
            Query::Q3 => q3(persons, auctions),
            Query::Q4 => q4(auctions, bids),
            Query::Q5 => q5(bids),
            Query::Q7 => q7(bids),
            Query::Q8 => q8(persons, auctions),
            Query::Q9 => q9(auctions, bids),
            Query::Q11 => q11(bids),
        }
    }
}

/// q0: every bid, projected.
pub fn q0(bids: &[Bid]) -> Vec<String> {
    bids.iter()
        .map(|b| {
            format!(
                "{},{},{},{},{}",
                b.auction, b.bidder, b.price, b.date_time, b.extra
            )
        })
        .collect()
}

/// q1: every bid with its price in euros.
pub fn q1(bids: &[Bid]) -> Vec<String> {
    bids.iter()
        .map(|b| {
            let mut s = format!("{},{},", b.auction, b.bidder);
            csv::write_euro(b.price, &mut s);
            let _ = write!(s, ",{},{}", b.date_time, b.extra);
            s
        })
        .collect()
}

/// q2: bids of every 123rd auction.
pub fn q2(bids: &[Bid]) -> Vec<String> {
    bids.iter()
        .filter(|b| b.auction % 123 == 0)
        .map(|b| format!("{},{}", b.auction, b.price))
        .collect()
}

/// The states q3 selects sellers in.
pub const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];
/// The category q3 selects auctions of.
pub const Q3_CATEGORY: i64 = 10;

/// q3: auctions of category 10 with their seller, if the seller lives in OR, ID or CA.
pub fn q3(persons: &[Person], auctions: &[Auction]) -> Vec<String> {
    let sellers: HashMap<i64, Vec<&Person>> = persons
        .iter()
        .filter(|p| Q3_STATES.contains(&p.state.as_str()))
        .fold(HashMap::new(), |mut m, p| {
            m.entry(p.id).or_default().push(p);
            m
        });
    let mut out = Vec::new();
    for a in auctions.iter().filter(|a| a.category == Q3_CATEGORY) {
        for p in sellers.get(&a.seller).into_iter().flatten() {
            out.push(format!("{},{},{},{}", p.name, p.city, p.state, a.id));
        }
    }
    out
}

/// Per auction with at least one bid at `date_time..=expires`, the highest such price:
/// `(auction, final price)`.
fn finals<'a>(auctions: &'a [Auction], bids: &[Bid]) -> Vec<(&'a Auction, i64)> {
    let mut by_auction: HashMap<i64, Vec<&Bid>> = HashMap::new();
    for b in bids {
        by_auction.entry(b.auction).or_default().push(b);
    }
    auctions
        .iter()
        .filter_map(|a| {
            by_auction
                .get(&a.id)?
                .iter()
                .filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires)
                .map(|b| b.price)
                .max()
                .map(|m| (a, m))
        })
        .collect()
}

/// q4: the average winning price per category, append-only. Flink's SQL averages the
/// `MAX` of an updating join and so needs retractions; here an auction's final price is
/// the highest bid at `date_time..=expires`, known when the watermark passes `expires`,
/// and each category emits its running average (`AVG` of `BIGINT`: integer, truncated)
/// once per event time at which auctions of it closed. The last line per category is
/// Flink's final result.
pub fn q4(auctions: &[Auction], bids: &[Bid]) -> Vec<String> {
    // (category, close time) -> finals closing then.
    let mut closes: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
    for (a, m) in finals(auctions, bids) {
        closes.entry((a.category, a.expires)).or_default().push(m);
    }
    let mut totals: HashMap<i64, (i64, i64)> = HashMap::new();
    let mut out = Vec::new();
    for ((category, _), finals) in closes {
        let t = totals.entry(category).or_default();
        for f in finals {
            t.0 += f;
            t.1 += 1;
        }
        out.push(format!("{category},{}", t.0 / t.1));
    }
    out
}

/// Size of q5's sliding windows (ms).
pub const Q5_SIZE_MS: i64 = 10_000;
/// Slide of q5's sliding windows (ms).
pub const Q5_SLIDE_MS: i64 = 2_000;

/// q5: per sliding window, every auction with the most bids.
pub fn q5(bids: &[Bid]) -> Vec<String> {
    let mut counts: HashMap<(i64, i64), u64> = HashMap::new();
    for b in bids {
        let last = b.date_time - b.date_time.rem_euclid(Q5_SLIDE_MS);
        let mut start = last;
        while start > b.date_time - Q5_SIZE_MS {
            *counts.entry((start, b.auction)).or_default() += 1;
            start -= Q5_SLIDE_MS;
        }
    }
    let mut max: HashMap<i64, u64> = HashMap::new();
    for (&(start, _), &n) in &counts {
        let m = max.entry(start).or_default();
        *m = (*m).max(n);
    }
    counts
        .iter()
        .filter(|&(&(start, _), &n)| max[&start] == n)
        .map(|(&(start, auction), n)| format!("{start},{},{auction},{n}", start + Q5_SIZE_MS))
        .collect()
}

/// Size of q7's and q8's tumbling windows (ms).
pub const TUMBLE_MS: i64 = 10_000;

/// q7: bids at the highest price of a 10 s tumbling window, with `date_time` between the
/// window's end − 10 s and its end (both inclusive, as SQL's `BETWEEN`; a bid exactly at
/// the end also joins the next window's maximum if its price equals it).
pub fn q7(bids: &[Bid]) -> Vec<String> {
    let mut max: HashMap<i64, i64> = HashMap::new();
    for b in bids {
        let start = b.date_time - b.date_time.rem_euclid(TUMBLE_MS);
        let m = max.entry(start).or_insert(i64::MIN);
        *m = (*m).max(b.price);
    }
    let mut out = Vec::new();
    for b in bids {
        let own = b.date_time - b.date_time.rem_euclid(TUMBLE_MS);
        // Windows whose [end - 10 s, end] holds the bid: its own, and the one before if
        // the bid is exactly at its end.
        for start in [own, own - TUMBLE_MS] {
            let end = start + TUMBLE_MS;
            if b.date_time < start || b.date_time > end {
                continue;
            }
            if max.get(&start) == Some(&b.price) {
                out.push(format!(
                    "{},{},{},{},{}",
                    b.auction, b.price, b.bidder, b.date_time, b.extra
                ));
            }
        }
    }
    out
}

/// q8: persons who opened an auction in the 10 s tumbling window of their registration
/// (one line per person and window; sellers counted once per window).
pub fn q8(persons: &[Person], auctions: &[Auction]) -> Vec<String> {
    let window = |ts: i64| ts - ts.rem_euclid(TUMBLE_MS);
    let sellers: HashSet<(i64, i64)> = auctions
        .iter()
        .map(|a| (a.seller, window(a.date_time)))
        .collect();
    let people: HashSet<(i64, &str, i64)> = persons
        .iter()
        .map(|p| (p.id, p.name.as_str(), window(p.date_time)))
        .collect();
    people
        .into_iter()
        .filter(|(id, _, w)| sellers.contains(&(*id, *w)))
        .map(|(id, name, w)| format!("{id},{name},{w}"))
        .collect()
}

/// Whether bid `a` ranks before bid `b` as an auction's winner: higher price, then
/// earlier `date_time` (q9's `ORDER BY price DESC, dateTime ASC`), then lower bidder,
/// then the smaller `extra` (the SQL leaves further ties open; this fixes them).
pub fn wins(a: (i64, i64, i64, &str), b: (i64, i64, i64, &str)) -> bool {
    use std::cmp::Reverse;
    (a.0, Reverse(a.1), Reverse(a.2), Reverse(a.3))
        > (b.0, Reverse(b.1), Reverse(b.2), Reverse(b.3))
}

/// q9: every auction with at least one bid at `date_time..=expires`, with its winning
/// bid ([`wins`]), emitted once when the auction closes (Flink's SQL keeps a `ROW_NUMBER`
/// top 1 that it retracts as better bids arrive; its final rows are these).
pub fn q9(auctions: &[Auction], bids: &[Bid]) -> Vec<String> {
    let mut by_auction: HashMap<i64, Vec<&Bid>> = HashMap::new();
    for b in bids {
        by_auction.entry(b.auction).or_default().push(b);
    }
    let mut out = Vec::new();
    for a in auctions {
        let best = by_auction
            .get(&a.id)
            .into_iter()
            .flatten()
            .filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires)
            .fold(None::<&Bid>, |best, b| match best {
                Some(x)
                    if !wins(
                        (b.price, b.date_time, b.bidder, &b.extra),
                        (x.price, x.date_time, x.bidder, &x.extra),
                    ) =>
                {
                    Some(x)
                }
                _ => Some(b),
            });
        if let Some(b) = best {
            let mut s = csv::line(&crate::Event::Auction(a.clone()));
            let _ = write!(
                s,
                ",{},{},{},{},{}",
                b.auction, b.bidder, b.price, b.date_time, b.extra
            );
            out.push(s);
        }
    }
    out
}

/// Session gap of q11 (ms).
pub const Q11_GAP_MS: i64 = 10_000;

/// q11: bids per bidder session (gap 10 s). A session is `[first, last + gap)`; a bid at
/// or after `last + gap` starts a new one (sessions merge only when they overlap, not
/// when they touch: nop-stream's window rule, unlike Flink's).
pub fn q11(bids: &[Bid]) -> Vec<String> {
    let mut by_bidder: HashMap<i64, Vec<i64>> = HashMap::new();
    for b in bids {
        by_bidder.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut out = Vec::new();
    for (bidder, mut ts) in by_bidder {
        ts.sort_unstable();
        let (mut start, mut end, mut n) = (ts[0], ts[0] + Q11_GAP_MS, 0u64);
        for t in ts {
            if t >= end {
                out.push(format!("{bidder},{n},{start},{end}"));
                (start, n) = (t, 0);
            }
            end = end.max(t + Q11_GAP_MS);
            n += 1;
        }
        out.push(format!("{bidder},{n},{start},{end}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Event, event};

    fn stream(n: u64) -> (Vec<Person>, Vec<Auction>, Vec<Bid>) {
        let c = Config::default();
        let (mut p, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            match event(&c, i) {
                Event::Person(x) => p.push(x),
                Event::Auction(x) => a.push(x),
                Event::Bid(x) => b.push(x),
            }
        }
        (p, a, b)
    }

    #[test]
    fn every_query_yields_output_on_the_default_stream() {
        // 300k events: 30 s of event time, so every window kind fires several times.
        let (p, a, b) = stream(300_000);
        for q in Query::ALL {
            let out = q.run(&p, &a, &b);
            assert!(!out.is_empty(), "{} produced nothing", q.name());
        }
        assert_eq!(q0(&b).len(), b.len());
    }

    #[test]
    fn q11_sessions_split_at_exactly_the_gap() {
        let bid = |t: i64| Bid {
            auction: 1,
            bidder: 7,
            price: 1,
            channel: String::new(),
            url: String::new(),
            date_time: t,
            extra: String::new(),
        };
        let mut got = q11(&[bid(0), bid(9_999), bid(19_999), bid(30_000)]);
        got.sort();
        // 9,999 and 19,999 are exactly one gap apart: two sessions.
        assert_eq!(got, ["7,1,19999,29999", "7,1,30000,40000", "7,2,0,19999"]);
    }
}
