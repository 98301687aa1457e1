//! The job page (`GET /jobs/{job}`): complete without JavaScript, rendered here from the
//! same views as the JSON API — the job graph as SVG (a box per vertex with its
//! parallelism, counts and rates, busy ratio, backpressure and low watermark, coloured from
//! idle blue to busy red and grey when backpressured, as Flink's is; edges labelled with
//! their partition policy), the semantic mode, a throughput chart and a checkpoint-duration
//! chart (SVG, drawn here: no library, nothing fetched), the checkpoint history with a
//! link to each epoch's trace, and the exceptions. A small script reloads it every few
//! seconds while the job runs.

use nop_stream_coordinator::manager::{CheckpointsView, ExceptionView, JobView, VertexView};
use nop_stream_proto::cli::{JobState, JobStatus};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Escapes `s` for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const BOX_W: usize = 240;
const BOX_H: usize = 88;
const GAP_X: usize = 90;
const GAP_Y: usize = 30;

/// The graph as SVG: vertices in columns by their depth from the sources.
fn graph(v: &JobView) -> String {
    let mut depth: BTreeMap<&str, usize> = v.vertices.iter().map(|x| (x.id.as_str(), 0)).collect();
    // Longest path from a source; the plan is acyclic, so |V| rounds settle it.
    for _ in 0..v.vertices.len() {
        for e in &v.edges {
            let d = depth.get(e.from.as_str()).copied().unwrap_or(0) + 1;
            if let Some(t) = depth.get_mut(e.to.as_str())
                && *t < d
            {
                *t = d;
            }
        }
    }
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    let mut pos: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for x in &v.vertices {
        let col = depth[x.id.as_str()];
        let row = rows.entry(col).or_default();
        pos.insert(
            &x.id,
            (10 + col * (BOX_W + GAP_X), 10 + *row * (BOX_H + GAP_Y)),
        );
        *row += 1;
    }
    let width = pos.values().map(|p| p.0 + BOX_W + 10).max().unwrap_or(100);
    let height = pos.values().map(|p| p.1 + BOX_H + 10).max().unwrap_or(40);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="job graph">"#
    );
    for e in &v.edges {
        let (Some(a), Some(b)) = (pos.get(e.from.as_str()), pos.get(e.to.as_str())) else {
            continue;
        };
        let (x1, y1, x2, y2) = (a.0 + BOX_W, a.1 + BOX_H / 2, b.0, b.1 + BOX_H / 2);
        let label = match &e.output {
            Some(o) => format!("{} ({o})", e.partition),
            None => e.partition.clone(),
        };
        let _ = write!(
            s,
            r##"<g class="edge" data-from="{f}" data-to="{t}"><line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555"/><text class="partition" x="{mx}" y="{my}" font-size="11" text-anchor="middle">{l}</text></g>"##,
            f = esc(&e.from),
            t = esc(&e.to),
            mx = (x1 + x2) / 2,
            my = (y1 + y2) / 2 - 4,
            l = esc(&label),
        );
    }
    for x in &v.vertices {
        let (px, py) = pos[x.id.as_str()];
        let rate = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.0}/s"));
        let pct =
            |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{:.0}%", r * 100.0));
        let _ = write!(
            s,
            r##"<g class="vertex" data-id="{id}" data-busy="{b}" data-backpressured="{bp}"><rect x="{px}" y="{py}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="#336"/><text x="{tx}" y="{ty1}" font-size="12" font-weight="bold">{id}</text><text x="{tx}" y="{ty2}" font-size="11">parallelism {p}{keyed}</text><text x="{tx}" y="{ty3}" font-size="11">in {i} ({ri}), out {o} ({ro})</text><text x="{tx}" y="{ty4}" font-size="11">busy {pb}, backpressured {pbp}</text><text class="watermark" x="{tx}" y="{ty5}" font-size="11">watermark {wm}</text></g>"##,
            id = esc(&x.id),
            b = x.busy_ratio.map_or(String::new(), |r| format!("{r:.3}")),
            bp = x
                .backpressured_ratio
                .map_or(String::new(), |r| format!("{r:.3}")),
            fill = fill(x),
            tx = px + 8,
            ty1 = py + 18,
            ty2 = py + 34,
            ty3 = py + 50,
            ty4 = py + 66,
            ty5 = py + 82,
            p = x.parallelism,
            keyed = if x.keyed { ", keyed" } else { "" },
            i = x.records_in,
            ri = rate(x.records_in_per_second),
            o = x.records_out,
            ro = rate(x.records_out_per_second),
            pb = pct(x.busy_ratio),
            pbp = pct(x.backpressured_ratio),
            wm = x.low_watermark_ms.map_or_else(|| "-".to_owned(), utc),
        );
    }
    s.push_str("</svg>");
    s
}

/// A vertex box's colour: grey when mostly backpressured, else from idle blue
/// (`#eef4fb`) to busy red (`#f4a0a0`) by its busy ratio.
fn fill(x: &VertexView) -> String {
    if x.backpressured_ratio.is_some_and(|r| r > 0.5) {
        return "#b8b8b8".to_owned();
    }
    let b = x.busy_ratio.unwrap_or(0.0).clamp(0.0, 1.0);
    let mix = |idle: u8, busy: u8| {
        (f64::from(idle) + (f64::from(busy) - f64::from(idle)) * b).round() as u8
    };
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(0xee, 0xf4),
        mix(0xf4, 0xa0),
        mix(0xfb, 0xa0)
    )
}

/// Event time `ms` (since the Unix epoch) as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
pub fn utc(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1_000 % 60,
        rem % 1_000
    )
}

const CHART_W: f64 = 480.0;
const CHART_H: f64 = 120.0;

/// A small SVG chart with id `id`: bars when `bars`, else a line; `values` oldest first,
/// scaled to the largest, labelled with it in `unit`.
fn chart(id: &str, title: &str, values: &[f64], unit: &str, bars: bool) -> String {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let mut s = format!(
        r##"<figure><figcaption>{t} (max {max:.0} {unit})</figcaption><svg id="{id}" xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" role="img" aria-label="{t}"><rect width="{CHART_W}" height="{CHART_H}" fill="#fafafa" stroke="#ccc"/>"##,
        t = esc(title)
    );
    let n = values.len().max(1) as f64;
    let y = |v: f64| {
        CHART_H
            - 4.0
            - if max > 0.0 {
                v / max * (CHART_H - 8.0)
            } else {
                0.0
            }
    };
    if bars {
        let w = CHART_W / n;
        for (i, v) in values.iter().enumerate() {
            let _ = write!(
                s,
                r##"<rect class="point" x="{x:.1}" y="{top:.1}" width="{bw:.1}" height="{h:.1}" fill="#69c"/>"##,
                x = i as f64 * w + 1.0,
                top = y(*v),
                bw = (w - 2.0).max(1.0),
                h = CHART_H - 4.0 - y(*v),
            );
        }
    } else if !values.is_empty() {
        let step = CHART_W / (n - 1.0).max(1.0);
        let pts: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", i as f64 * step, y(*v)))
            .collect();
        let _ = write!(
            s,
            r##"<polyline class="line" points="{}" fill="none" stroke="#c33" stroke-width="1.5"/>"##,
            pts.join(" ")
        );
        for p in &pts {
            let (x, yy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(
                s,
                r##"<circle class="point" cx="{x}" cy="{yy}" r="1.5" fill="#c33"/>"##
            );
        }
    }
    s.push_str("</svg></figure>\n");
    s
}

/// The page of one job.
pub fn job_page(
    v: &JobView,
    checkpoints: Result<&CheckpointsView, String>,
    exceptions: &[ExceptionView],
) -> String {
    let st = &v.status;
    let job = esc(&st.job);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{job} - nopstream</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}th{{background:#f4f4f4}}.aborted{{color:#a00}}figure{{display:inline-block;margin:0 1em 0 0}}</style></head><body>
<h1>job <span id="job">{job}</span></h1>
<p id="summary">{name}: <b id="state">{state}</b>, run {run}, semantic mode <b id="semantic">{semantic}</b>, generation {generation}, recoveries <span id="recoveries">{recoveries}</span>; records read {read}, written {written}</p>
"#,
        name = esc(&st.name),
        state = st.state,
        run = st.run,
        semantic = esc(&st.semantic),
        generation = st.generation,
        recoveries = st.recoveries,
        read = st.records_read,
        written = st.records_written,
    );
    s.push_str("<h2>Graph</h2>\n");
    s.push_str(&graph(v));
    s.push_str("\n<h2>Charts</h2>\n");
    let rates: Vec<f64> = v.throughput.iter().map(|p| p.records_per_second).collect();
    s.push_str(&chart(
        "throughput-chart",
        "records read per second",
        &rates,
        "records/s",
        false,
    ));
    s.push_str("\n<h2>Checkpoints</h2>\n");
    match checkpoints {
        Ok(c) => {
            let durations: Vec<f64> = c
                .history
                .iter()
                .take(50)
                .rev()
                .filter_map(|e| e.duration_ms.map(|d| d as f64))
                .collect();
            s.push_str(&chart(
                "checkpoint-chart",
                "checkpoint duration of the last durable epochs",
                &durations,
                "ms",
                true,
            ));
            let _ = write!(
                s,
                r#"<p id="checkpoint-counts">{} created, {} durable, {} committed, {} aborted, {} pending</p>
<table id="checkpoints"><tr><th>epoch</th><th>state</th><th>attempt</th><th>duration</th><th>detail</th></tr>
"#,
                c.triggered, c.durable, c.committed, c.aborted, c.pending
            );
            for e in c.history.iter().take(50) {
                let _ = writeln!(
                    s,
                    r#"<tr class="epoch {state}" data-epoch="{n}"><td><a href="/api/v1/jobs/{job}/checkpoints/{n}">{n}</a></td><td>{state}</td><td>{a}</td><td>{d}</td><td>{detail}</td></tr>"#,
                    n = e.epoch,
                    state = esc(&e.state),
                    a = e.attempt,
                    d = e
                        .duration_ms
                        .map_or_else(|| "-".to_owned(), |d| format!("{d} ms")),
                    detail = esc(e.detail.as_deref().unwrap_or("")),
                );
            }
            s.push_str("</table>\n");
        }
        Err(e) => {
            let _ = writeln!(s, r#"<p id="checkpoints-error">{}</p>"#, esc(&e));
        }
    }
    s.push_str("<h2>Exceptions</h2>\n<ul id=\"exceptions\">\n");
    for e in exceptions {
        let _ = writeln!(
            s,
            r#"<li class="exception">run {} ({}), {} recoveries: <code>{}</code></li>"#,
            e.run,
            e.state,
            e.recoveries,
            esc(&e.error)
        );
    }
    s.push_str("</ul>\n");
    if matches!(st.state, JobState::Running | JobState::Submitted) {
        s.push_str("<script>setTimeout(function(){location.reload()},3000)</script>\n");
    }
    s.push_str("</body></html>\n");
    s
}

/// The list of jobs, each linking to its page.
pub fn jobs_page(jobs: &[JobStatus]) -> String {
    let mut s = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>nopstream</title></head><body><h1>Jobs</h1><ul id=\"jobs\">\n",
    );
    for j in jobs {
        let _ = writeln!(
            s,
            r#"<li><a href="/jobs/{id}">{id}</a> ({name}): {state}</li>"#,
            id = esc(&j.job),
            name = esc(&j.name),
            state = j.state
        );
    }
    s.push_str("</ul></body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_time_renders_as_a_utc_civil_date() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        // 2013-01-01 05:00 UTC, the flights' first scheduled hour (EST 00:00).
        assert_eq!(utc(1_357_016_400_000), "2013-01-01 05:00:00.000");
        assert_eq!(utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(utc(-1), "1969-12-31 23:59:59.999");
    }

    #[test]
    fn charts_draw_one_mark_per_value_scaled_to_the_largest() {
        let bars = chart("c", "t", &[1.0, 2.0, 4.0], "ms", true);
        assert_eq!(bars.matches("class=\"point\"").count(), 3);
        assert!(bars.contains("(max 4 ms)"), "{bars}");
        // The largest bar spans the chart's height less the margins.
        assert!(bars.contains("height=\"112.0\""), "{bars}");
        let line = chart("l", "t", &[5.0, 0.0], "records/s", false);
        assert!(line.contains("points=\"0.0,4.0 480.0,116.0\""), "{line}");
        let empty = chart("e", "t", &[], "ms", false);
        assert!(!empty.contains("class=\"point\"") && !empty.contains("polyline"));
    }
}
