//! The Nexmark benchmark's events: persons, auctions and bids.
//!
//! [`event`] generates event `index` of the stream as a pure function of the seed and
//! the index, with the rates, proportions and id relations of the nexmark repository's
//! generator (`nexmark-flink/.../generator`, itself Apache Beam's), at its default
//! configuration ([`Config::default`]):
//!
//! - of every 50 consecutive events, 1 is a person, 3 are auctions, 46 are bids (event
//!   `i` is a person when `i mod 50 == 0`, an auction when `1..=3`, else a bid);
//! - event `i` happens at `base_time_ms + i * 1_000_000 / rate / 1000` ms (10,000 events
//!   per second of event time by default: 10 per ms);
//! - person ids are `1000 + ` the number of persons before; auction ids likewise;
//!   categories `10..=14`;
//! - an auction's seller is, 3 times in 4 ("hot sellers"), the first person of the last
//!   block of 100 persons, else a random one of the last 1,000 persons (or up to 10
//!   ahead); it expires a random `1..=2h` ms after it starts, `h` being the event time
//!   100 auctions take (≈ 167 ms);
//! - a bid's auction is, 1 time in 2, the first auction of the last block of 100, else a
//!   random one of the last 100 (or up to 10 ahead, not created yet); its bidder is, 3
//!   times in 4, the second person of the last block of 100, else a random active person;
//! - prices are `round(10^(6u) * 100)` cents for uniform `u`; names, e-mail addresses,
//!   credit cards, cities, states, channels and URLs from the generator's lists;
//!   `extra` pads each event to the generator's average sizes (persons 200 bytes,
//!   auctions 500, bids 100).
//!
//! Where this differs from the nexmark repository: its generator draws from one
//! unseeded random stream per source instance (so two runs differ); here every event has
//! its own stream seeded from `(seed, index)`, so any split of the index range generates
//! the same events. Its `BidGenerator` adds `FIRST_PERSON_ID` to the bidder twice, so
//! hot bidders are ids no person has; here it is added once, as in Beam's generator (the
//! id relation the benchmark describes). `extra` is cut from a 64 KiB fixed string
//! rather than a fresh 1 MiB random one.
//!
//! [`csv`] writes and parses the events' CSV lines; [`queries`] computes each query's
//! output in plain Rust.

pub mod csv;
pub mod queries;

use std::sync::OnceLock;

/// The first person id.
pub const FIRST_PERSON_ID: i64 = 1000;
/// The first auction id.
pub const FIRST_AUCTION_ID: i64 = 1000;
/// The first category id.
pub const FIRST_CATEGORY_ID: i64 = 10;
/// Number of categories.
pub const NUM_CATEGORIES: u64 = 5;
/// Default event time of event 0 (ms since the Unix epoch): 2023-11-14T22:13:20Z, the
/// bench's bids file's start.
pub const BASE_TIME_MS: i64 = 1_700_000_000_000;

const PERSON_ID_LEAD: u64 = 10;
const AUCTION_ID_LEAD: u64 = 10;
const HOT_SELLER_RATIO: i64 = 100;
const HOT_AUCTION_RATIO: i64 = 100;
const HOT_BIDDER_RATIO: i64 = 100;
const HOT_CHANNELS_RATIO: u64 = 2;
const CHANNELS_NUMBER: usize = 10_000;
const EXTRA_POOL: usize = 64 * 1024;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

/// The generator's parameters (the nexmark repository's `NexmarkConfiguration`
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Seeds every event's random stream (default 42).
    pub seed: u64,
    /// Event time of event 0, ms since the Unix epoch.
    pub base_time_ms: i64,
    /// Events per second of event time (default 10,000).
    pub events_per_second: u64,
    /// Persons among every `total` events (default 1).
    pub person_proportion: u64,
    /// Auctions among every `total` events (default 3).
    pub auction_proportion: u64,
    /// Bids among every `total` events (default 46).
    pub bid_proportion: u64,
    /// Persons a random seller or bidder is drawn from (default 1,000).
    pub num_active_people: u64,
    /// Auctions a random bid's auction is drawn from (default 100).
    pub num_in_flight_auctions: u64,
    /// 1 in this many bids is for a random auction, the rest for the hot one (default 2).
    pub hot_auction_ratio: u64,
    /// 1 in this many auctions is by a random seller (default 4).
    pub hot_sellers_ratio: u64,
    /// 1 in this many bids is by a random bidder (default 4).
    pub hot_bidders_ratio: u64,
    /// Average person size the `extra` field pads to (bytes, default 200).
    pub avg_person_bytes: usize,
    /// Average auction size (bytes, default 500).
    pub avg_auction_bytes: usize,
    /// Average bid size (bytes, default 100).
    pub avg_bid_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 42,
            base_time_ms: BASE_TIME_MS,
            events_per_second: 10_000,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            num_active_people: 1000,
            num_in_flight_auctions: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            avg_person_bytes: 200,
            avg_auction_bytes: 500,
            avg_bid_bytes: 100,
        }
    }
}

/// The kind of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A new person.
    Person,
    /// A new auction.
    Auction,
    /// A bid.
    Bid,
}

impl Kind {
    /// `person`, `auction` or `bid`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Person => "person",
            Kind::Auction => "auction",
            Kind::Bid => "bid",
        }
    }

    /// The kind named `s` (`person`, `auction`, `bid`).
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "person" => Some(Kind::Person),
            "auction" => Some(Kind::Auction),
            "bid" => Some(Kind::Bid),
            _ => None,
        }
    }
}

/// A person (Nexmark's `Person`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// Person id.
    pub id: i64,
    /// "First Last".
    pub name: String,
    /// E-mail address.
    pub email: String,
    /// Four groups of four digits.
    pub credit_card: String,
    /// US city.
    pub city: String,
    /// US state (two letters).
    pub state: String,
    /// Event time (ms).
    pub date_time: i64,
    /// Padding.
    pub extra: String,
}

/// An auction (Nexmark's `Auction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auction {
    /// Auction id.
    pub id: i64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Initial bid (cents).
    pub initial_bid: i64,
    /// Reserve price (cents).
    pub reserve: i64,
    /// Event time (ms): when the auction opens.
    pub date_time: i64,
    /// When it closes (ms).
    pub expires: i64,
    /// Seller (person id).
    pub seller: i64,
    /// Category id.
    pub category: i64,
    /// Padding.
    pub extra: String,
}

/// A bid (Nexmark's `Bid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bid {
    /// Auction id.
    pub auction: i64,
    /// Bidder (person id).
    pub bidder: i64,
    /// Price (cents).
    pub price: i64,
    /// Channel name.
    pub channel: String,
    /// URL.
    pub url: String,
    /// Event time (ms).
    pub date_time: i64,
    /// Padding.
    pub extra: String,
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A person.
    Person(Person),
    /// An auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Event {
    /// Its event time (ms).
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}

/// splitmix64 step: the event's random stream.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ 0x6A09_E667_F3BC_C909);
        r.0 ^= r.next().wrapping_add(index);
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n >= 1`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn string(&mut self, max_len: u64, special: char, out: &mut String) {
        let len = 3 + self.below(max_len - 3);
        let start = out.len();
        for _ in 0..len {
            if self.below(13) == 0 {
                out.push(special);
            } else {
                out.push((b'a' + self.below(26) as u8) as char);
            }
        }
        let trimmed = out[start..].trim().to_owned();
        out.truncate(start);
        out.push_str(&trimmed);
    }

    fn price(&mut self) -> i64 {
        (10f64.powf(self.unit() * 6.0) * 100.0).round() as i64
    }

    fn extra(&mut self, current: usize, desired: usize) -> String {
        if current > desired {
            return String::new();
        }
        let desired = desired - current;
        let delta = (desired as f64 * 0.2).round() as usize;
        let min = desired - delta;
        let size = min
            + if delta == 0 {
                0
            } else {
                self.below(2 * delta as u64) as usize
            };
        let pool = extra_pool();
        let offset = self.below((pool.len() - size) as u64) as usize;
        pool[offset..offset + size].to_owned()
    }
}

/// The fixed string `extra` fields are cut from: 64 KiB of lowercase letters.
fn extra_pool() -> &'static str {
    static POOL: OnceLock<String> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut r = Rng::new(0, u64::MAX);
        (0..EXTRA_POOL)
            .map(|_| (b'a' + r.below(26) as u8) as char)
            .collect()
    })
}

fn base_url(r: &mut Rng) -> String {
    let mut s = String::from("https://www.nexmark.com/");
    for _ in 0..3 {
        r.string(5, '_', &mut s);
        s.push('/');
    }
    s.push_str("item.htm?query=1");
    s
}

/// The hot channels' URLs, and the 10,000 other channels' (name, URL).
type Channels = (Vec<String>, Vec<(String, String)>);

/// The channels, fixed.
fn channels() -> &'static Channels {
    static CHANNELS: OnceLock<Channels> = OnceLock::new();
    CHANNELS.get_or_init(|| {
        let mut r = Rng::new(1, u64::MAX);
        let hot = (0..HOT_CHANNELS.len()).map(|_| base_url(&mut r)).collect();
        let cache = (0..CHANNELS_NUMBER)
            .map(|i| {
                let mut url = base_url(&mut r);
                if r.below(10) > 0 {
                    url.push_str(&format!(
                        "&channel_id={}",
                        (i as i32).reverse_bits().unsigned_abs()
                    ));
                }
                (format!("channel-{i}"), url)
            })
            .collect();
        (hot, cache)
    })
}

impl Config {
    /// Events per proportion cycle (default 50).
    pub const fn total_proportion(&self) -> u64 {
        self.person_proportion + self.auction_proportion + self.bid_proportion
    }

    /// The kind of event `index`.
    pub const fn kind_of(&self, index: u64) -> Kind {
        let rem = index % self.total_proportion();
        if rem < self.person_proportion {
            Kind::Person
        } else if rem < self.person_proportion + self.auction_proportion {
            Kind::Auction
        } else {
            Kind::Bid
        }
    }

    /// The event time of event `index` (ms).
    pub const fn timestamp_of(&self, index: u64) -> i64 {
        // 1e6 / rate µs between events, in integer arithmetic: index * 1000 / rate ms.
        self.base_time_ms + (index as u128 * 1000 / self.events_per_second as u128) as i64
    }

    fn last_base0_person_id(&self, index: u64) -> i64 {
        let epoch = index / self.total_proportion();
        let mut offset = index % self.total_proportion();
        if offset >= self.person_proportion {
            offset = self.person_proportion - 1;
        }
        (epoch * self.person_proportion + offset) as i64
    }

    fn last_base0_auction_id(&self, index: u64) -> i64 {
        let mut epoch = (index / self.total_proportion()) as i64;
        let mut offset = (index % self.total_proportion()) as i64;
        let (p, a) = (
            self.person_proportion as i64,
            self.auction_proportion as i64,
        );
        if offset < p {
            epoch -= 1;
            offset = a - 1;
        } else if offset >= p + a {
            offset = a - 1;
        } else {
            offset -= p;
        }
        epoch * a + offset
    }

    fn next_base0_person_id(&self, index: u64, r: &mut Rng) -> i64 {
        let num_people = self.last_base0_person_id(index) + 1;
        let active = num_people.min(self.num_active_people as i64);
        let n = r.below(active as u64 + PERSON_ID_LEAD) as i64;
        num_people - active + n
    }

    fn next_base0_auction_id(&self, index: u64, r: &mut Rng) -> i64 {
        let max = self.last_base0_auction_id(index);
        let min = (max - self.num_in_flight_auctions as i64).max(0);
        min + r.below((max - min + 1) as u64 + AUCTION_ID_LEAD) as i64
    }
}

/// Event `index` of the stream generated with `config`: a pure function of
/// `config.seed` and `index`.
pub fn event(config: &Config, index: u64) -> Event {
    let ts = config.timestamp_of(index);
    let mut r = Rng::new(config.seed, index);
    match config.kind_of(index) {
        Kind::Person => Event::Person(person(config, index, ts, &mut r)),
        Kind::Auction => Event::Auction(auction(config, index, ts, &mut r)),
        Kind::Bid => Event::Bid(bid(config, index, ts, &mut r)),
    }
}

fn person(config: &Config, index: u64, ts: i64, r: &mut Rng) -> Person {
    let id = config.last_base0_person_id(index) + FIRST_PERSON_ID;
    let name = format!(
        "{} {}",
        FIRST_NAMES[r.below(FIRST_NAMES.len() as u64) as usize],
        LAST_NAMES[r.below(LAST_NAMES.len() as u64) as usize]
    );
    let mut email = String::new();
    r.string(7, ' ', &mut email);
    email.push('@');
    r.string(5, ' ', &mut email);
    email.push_str(".com");
    let credit_card = (0..4)
        .map(|_| format!("{:04}", r.below(10_000)))
        .collect::<Vec<_>>()
        .join(" ");
    let city = US_CITIES[r.below(US_CITIES.len() as u64) as usize].to_owned();
    let state = US_STATES[r.below(US_STATES.len() as u64) as usize].to_owned();
    let size = 8 + name.len() + email.len() + credit_card.len() + city.len() + state.len();
    let extra = r.extra(size, config.avg_person_bytes);
    Person {
        id,
        name,
        email,
        credit_card,
        city,
        state,
        date_time: ts,
        extra,
    }
}

fn auction(config: &Config, index: u64, ts: i64, r: &mut Rng) -> Auction {
    let id = config.last_base0_auction_id(index) + FIRST_AUCTION_ID;
    let seller = if r.below(config.hot_sellers_ratio) > 0 {
        (config.last_base0_person_id(index) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    } else {
        config.next_base0_person_id(index, r)
    } + FIRST_PERSON_ID;
    let category = FIRST_CATEGORY_ID + r.below(NUM_CATEGORIES) as i64;
    let initial_bid = r.price();
    // Nexmark's auction length: uniform in 1..=2h, h the event time until the auction
    // `num_in_flight_auctions` ahead is generated.
    let ahead =
        config.num_in_flight_auctions * config.total_proportion() / config.auction_proportion;
    let horizon = config.timestamp_of(index + ahead) - ts;
    let expires = ts + 1 + r.below((horizon * 2).max(1) as u64) as i64;
    let mut item_name = String::new();
    r.string(20, ' ', &mut item_name);
    let mut description = String::new();
    r.string(100, ' ', &mut description);
    let reserve = initial_bid + r.price();
    let size = 8 + item_name.len() + description.len() + 8 + 8 + 8 + 8 + 8;
    let extra = r.extra(size, config.avg_auction_bytes);
    Auction {
        id,
        item_name,
        description,
        initial_bid,
        reserve,
        date_time: ts,
        expires,
        seller,
        category,
        extra,
    }
}

fn bid(config: &Config, index: u64, ts: i64, r: &mut Rng) -> Bid {
    let auction = if r.below(config.hot_auction_ratio) > 0 {
        (config.last_base0_auction_id(index) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    } else {
        config.next_base0_auction_id(index, r)
    } + FIRST_AUCTION_ID;
    let bidder = if r.below(config.hot_bidders_ratio) > 0 {
        (config.last_base0_person_id(index) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    } else {
        config.next_base0_person_id(index, r)
    } + FIRST_PERSON_ID;
    let price = r.price();
    let (channel, url) = if r.below(HOT_CHANNELS_RATIO) > 0 {
        let i = r.below(HOT_CHANNELS.len() as u64) as usize;
        (HOT_CHANNELS[i].to_owned(), channels().0[i].clone())
    } else {
        let (c, u) = &channels().1[r.below(CHANNELS_NUMBER as u64) as usize];
        (c.clone(), u.clone())
    };
    let extra = r.extra(8 + 8 + 8 + 8, config.avg_bid_bytes);
    Bid {
        auction,
        bidder,
        price,
        channel,
        url,
        date_time: ts,
        extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportions_and_ids_follow_the_generator() {
        let c = Config::default();
        let events: Vec<Event> = (0..5000).map(|i| event(&c, i)).collect();
        let persons = events
            .iter()
            .filter(|e| matches!(e, Event::Person(_)))
            .count();
        let auctions = events
            .iter()
            .filter(|e| matches!(e, Event::Auction(_)))
            .count();
        assert_eq!((persons, auctions), (100, 300));
        let mut next_person = FIRST_PERSON_ID;
        let mut next_auction = FIRST_AUCTION_ID;
        for (i, e) in events.iter().enumerate() {
            assert_eq!(
                e.date_time(),
                BASE_TIME_MS + i as i64 / 10,
                "10 events per ms"
            );
            match e {
                Event::Person(p) => {
                    assert_eq!(p.id, next_person);
                    next_person += 1;
                }
                Event::Auction(a) => {
                    assert_eq!(a.id, next_auction);
                    next_auction += 1;
                    assert!((10..15).contains(&a.category));
                    assert!(a.expires > a.date_time && a.expires <= a.date_time + 2 * 167);
                    assert!(a.seller < next_person + 10, "a seller exists or is a lead");
                    assert!(a.reserve >= a.initial_bid);
                }
                Event::Bid(b) => {
                    assert!(b.auction < next_auction + 10);
                    assert!(b.bidder < next_person + 10);
                    assert!((1..=100_000_000).contains(&b.price));
                }
            }
        }
        // Every field is free of the CSV separator.
        for e in &events {
            let line = csv::line(e);
            assert_eq!(
                line.matches(',').count(),
                match e {
                    Event::Person(_) => 7,
                    Event::Auction(_) => 9,
                    Event::Bid(_) => 6,
                }
            );
        }
    }

    #[test]
    fn events_are_a_pure_function_of_seed_and_index() {
        let c = Config::default();
        assert_eq!(event(&c, 1234), event(&c, 1234));
        let other = Config { seed: 7, ..c };
        assert_ne!(csv::line(&event(&c, 1234)), csv::line(&event(&other, 1234)));
        // Sizes near the generator's averages.
        let avg = |k: Kind| {
            let lines: Vec<String> = (0..20_000)
                .filter(|&i| c.kind_of(i) == k)
                .map(|i| csv::line(&event(&c, i)))
                .collect();
            lines.iter().map(String::len).sum::<usize>() / lines.len()
        };
        assert!(
            (150..300).contains(&avg(Kind::Person)),
            "{}",
            avg(Kind::Person)
        );
        assert!(
            (450..600).contains(&avg(Kind::Auction)),
            "{}",
            avg(Kind::Auction)
        );
        assert!((120..260).contains(&avg(Kind::Bid)), "{}", avg(Kind::Bid));
    }
}
