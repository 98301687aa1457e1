//! The job page (`GET /jobs/{job}`): complete without JavaScript, rendered here from the
//! same views as the JSON API — the job graph as SVG (a box per vertex with its
//! parallelism and counts, edges labelled with their partition policy), the semantic mode,
//! the checkpoint history with a link to each epoch's trace, and the exceptions. A small
//! script reloads it every few seconds while the job runs.

use nop_stream_coordinator::manager::{CheckpointsView, ExceptionView, JobView};
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
const BOX_H: usize = 70;
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
        let _ = write!(
            s,
            r##"<g class="vertex" data-id="{id}"><rect x="{px}" y="{py}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="#eef4fb" stroke="#336"/><text x="{tx}" y="{ty1}" font-size="12" font-weight="bold">{id}</text><text x="{tx}" y="{ty2}" font-size="11">parallelism {p}{keyed}</text><text x="{tx}" y="{ty3}" font-size="11">in {i} ({ri}), out {o} ({ro})</text></g>"##,
            id = esc(&x.id),
            tx = px + 8,
            ty1 = py + 18,
            ty2 = py + 36,
            ty3 = py + 54,
            p = x.parallelism,
            keyed = if x.keyed { ", keyed" } else { "" },
            i = x.records_in,
            ri = rate(x.records_in_per_second),
            o = x.records_out,
            ro = rate(x.records_out_per_second),
        );
    }
    s.push_str("</svg>");
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
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}th{{background:#f4f4f4}}.aborted{{color:#a00}}</style></head><body>
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
    s.push_str("\n<h2>Checkpoints</h2>\n");
    match checkpoints {
        Ok(c) => {
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
