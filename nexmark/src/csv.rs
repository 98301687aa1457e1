//! The events' CSV lines (no header, no quoting: no generated field holds a comma, a
//! quote or a line break), one file or stream per kind:
//!
//! | kind | columns |
//! |---|---|
//! | person | [`PERSON_FIELDS`]: `id,name,email,credit_card,city,state,date_time,extra` |
//! | auction | [`AUCTION_FIELDS`]: `id,item_name,description,initial_bid,reserve,date_time,expires,seller,category,extra` |
//! | bid | [`BID_FIELDS`]: `auction,bidder,price,channel,url,date_time,extra` |
//!
//! Times are integers, ms since the Unix epoch; prices integers (cents).

use crate::{Auction, Bid, Event, Kind, Person};
use std::fmt::Write as _;

/// Columns of a person line.
pub const PERSON_FIELDS: [&str; 8] = [
    "id",
    "name",
    "email",
    "credit_card",
    "city",
    "state",
    "date_time",
    "extra",
];
/// Columns of an auction line.
pub const AUCTION_FIELDS: [&str; 10] = [
    "id",
    "item_name",
    "description",
    "initial_bid",
    "reserve",
    "date_time",
    "expires",
    "seller",
    "category",
    "extra",
];
/// Columns of a bid line.
pub const BID_FIELDS: [&str; 7] = [
    "auction",
    "bidder",
    "price",
    "channel",
    "url",
    "date_time",
    "extra",
];

/// The columns of `kind`'s lines.
pub const fn fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Person => &PERSON_FIELDS,
        Kind::Auction => &AUCTION_FIELDS,
        Kind::Bid => &BID_FIELDS,
    }
}

/// Appends the CSV line of `event` (without line break) to `out`.
pub fn write(event: &Event, out: &mut String) {
    let _ = match event {
        Event::Person(p) => write!(
            out,
            "{},{},{},{},{},{},{},{}",
            p.id, p.name, p.email, p.credit_card, p.city, p.state, p.date_time, p.extra
        ),
        Event::Auction(a) => write!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            a.id,
            a.item_name,
            a.description,
            a.initial_bid,
            a.reserve,
            a.date_time,
            a.expires,
            a.seller,
            a.category,
            a.extra
        ),
        Event::Bid(b) => write!(
            out,
            "{},{},{},{},{},{},{}",
            b.auction, b.bidder, b.price, b.channel, b.url, b.date_time, b.extra
        ),
    };
}

/// The CSV line of `event`.
pub fn line(event: &Event) -> String {
    let mut s = String::new();
    write(event, &mut s);
    s
}

fn cols<const N: usize>(line: &str, kind: Kind) -> Result<[&str; N], String> {
    let mut out = [""; N];
    let mut it = line.split(',');
    for slot in &mut out {
        *slot = it.next().ok_or_else(|| {
            format!(
                "{} line has fewer than {N} columns: {line:?}",
                kind.as_str()
            )
        })?;
    }
    if it.next().is_some() {
        return Err(format!(
            "{} line has more than {N} columns: {line:?}",
            kind.as_str()
        ));
    }
    Ok(out)
}

fn int(s: &str, field: &str) -> Result<i64, String> {
    s.parse()
        .map_err(|_| format!("column {field}: {s:?} is not an integer"))
}

/// Parses a person line.
///
/// # Errors
/// A message naming the column count or the column that is not an integer.
pub fn parse_person(line: &str) -> Result<Person, String> {
    let c: [&str; 8] = cols(line, Kind::Person)?;
    Ok(Person {
        id: int(c[0], "id")?,
        name: c[1].to_owned(),
        email: c[2].to_owned(),
        credit_card: c[3].to_owned(),
        city: c[4].to_owned(),
        state: c[5].to_owned(),
        date_time: int(c[6], "date_time")?,
        extra: c[7].to_owned(),
    })
}

/// Parses an auction line.
///
/// # Errors
/// As [`parse_person`].
pub fn parse_auction(line: &str) -> Result<Auction, String> {
    let c: [&str; 10] = cols(line, Kind::Auction)?;
    Ok(Auction {
        id: int(c[0], "id")?,
        item_name: c[1].to_owned(),
        description: c[2].to_owned(),
        initial_bid: int(c[3], "initial_bid")?,
        reserve: int(c[4], "reserve")?,
        date_time: int(c[5], "date_time")?,
        expires: int(c[6], "expires")?,
        seller: int(c[7], "seller")?,
        category: int(c[8], "category")?,
        extra: c[9].to_owned(),
    })
}

/// Parses a bid line.
///
/// # Errors
/// As [`parse_person`].
pub fn parse_bid(line: &str) -> Result<Bid, String> {
    let c: [&str; 7] = cols(line, Kind::Bid)?;
    Ok(Bid {
        auction: int(c[0], "auction")?,
        bidder: int(c[1], "bidder")?,
        price: int(c[2], "price")?,
        channel: c[3].to_owned(),
        url: c[4].to_owned(),
        date_time: int(c[5], "date_time")?,
        extra: c[6].to_owned(),
    })
}

/// Parses a line of `kind`.
///
/// # Errors
/// As [`parse_person`].
pub fn parse(kind: Kind, line: &str) -> Result<Event, String> {
    Ok(match kind {
        Kind::Person => Event::Person(parse_person(line)?),
        Kind::Auction => Event::Auction(parse_auction(line)?),
        Kind::Bid => Event::Bid(parse_bid(line)?),
    })
}

/// Formats `price` (cents) × 0.908 with three decimals, exactly (Nexmark q1's
/// `0.908 * price` as `DECIMAL(23, 3)`).
pub fn write_euro(price: i64, out: &mut impl std::fmt::Write) {
    // Every price up to i64::MAX / 908 in magnitude (all real ones) in 64-bit arithmetic:
    // 128-bit multiplies and divisions are libcalls on wasm32, the plugins' target.
    const IN_U64: u64 = (i64::MAX / 908) as u64;
    let sign = if price < 0 { "-" } else { "" };
    let abs = price.unsigned_abs();
    let _ = if abs <= IN_U64 {
        let m = abs * 908;
        write!(out, "{sign}{}.{:03}", m / 1000, m % 1000)
    } else {
        let m = u128::from(abs) * 908;
        write!(out, "{sign}{}.{:03}", m / 1000, m % 1000)
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, event};

    #[test]
    fn lines_round_trip() {
        let c = Config::default();
        for i in 0..500 {
            let e = event(&c, i);
            let kind = c.kind_of(i);
            assert_eq!(parse(kind, &line(&e)).unwrap(), e);
        }
        assert!(parse_bid("1,2,3").unwrap_err().contains("fewer than 7"));
        assert!(parse_bid("1,2,x,c,u,5,e").unwrap_err().contains("price"));
    }

    #[test]
    fn euro_has_three_exact_decimals() {
        let mut s = String::new();
        write_euro(12_345, &mut s);
        assert_eq!(s, "11209.260");
        s.clear();
        write_euro(1, &mut s);
        assert_eq!(s, "0.908");
        // Both paths against the 128-bit formula, around the switch and at the ends.
        let limit = i64::MAX / 908;
        for p in [
            0,
            -1,
            999,
            -1000,
            limit - 1,
            limit,
            limit + 1,
            -limit,
            -limit - 1,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ] {
            let milli = i128::from(p) * 908;
            let sign = if milli < 0 { "-" } else { "" };
            let m = milli.unsigned_abs();
            s.clear();
            write_euro(p, &mut s);
            assert_eq!(s, format!("{sign}{}.{:03}", m / 1000, m % 1000), "{p}");
        }
    }
}
