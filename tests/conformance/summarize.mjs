// Reads the conformance suite's per-scenario checks.json files for the targets
// run by run.sh and writes a Markdown summary.
//
//   node summarize.mjs RAW_DIR OUT_MD
//
// RAW_DIR holds, per target (direct, through, proxy, demo):
//   <target>/status            "ran", or "skipped: <reason>"
//   <target>/{active,pending}/server-<scenario>-<timestamp>/checks.json
// and scenarios.txt (every server scenario, one per line, in the suite's order).
//
// A scenario passes when none of its checks is a FAILURE (the suite's own rule);
// WARNING and INFO checks do not fail it. Exit status: 1 when some scenario has
// more FAILURE checks through mcpyard (as a gateway, or as a one-route proxy)
// than directly (or did not run through it while it ran directly), else 0. The
// demo column never affects it.

import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const [rawDir, outMd] = process.argv.slice(2);
if (!rawDir || !outMd) {
  console.error('usage: node summarize.mjs RAW_DIR OUT_MD');
  process.exit(2);
}

const TARGETS = [
  { key: 'direct', title: 'reference direct' },
  { key: 'through', title: 'reference through mcpyard' },
  { key: 'proxy', title: 'reference through a one-route mcpyard proxy' },
  { key: 'demo', title: 'mcpyard demo' },
];
/** The targets that put mcpyard in front of the reference: each must do as well as direct. */
const GATEWAYS = TARGETS.filter((t) => t.key === 'through' || t.key === 'proxy');

const scenarios = readFileSync(join(rawDir, 'scenarios.txt'), 'utf8').split('\n').map((s) => s.trim()).filter(Boolean);
const TS = /-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$/;

function loadTarget(key) {
  const dir = join(rawDir, key);
  const statusFile = join(dir, 'status');
  const status = existsSync(statusFile) ? readFileSync(statusFile, 'utf8').trim() : 'skipped: not run';
  const results = new Map(); // scenario -> { suite, checks }
  for (const suite of ['active', 'pending']) {
    const sd = join(dir, suite);
    if (!existsSync(sd)) continue;
    for (const d of readdirSync(sd)) {
      if (!d.startsWith('server-') || !TS.test(d)) continue;
      const name = d.slice('server-'.length).replace(TS, '');
      const f = join(sd, d, 'checks.json');
      if (!existsSync(f)) continue;
      results.set(name, { suite, checks: JSON.parse(readFileSync(f, 'utf8')) });
    }
  }
  return { status, results };
}

const data = Object.fromEntries(TARGETS.map((t) => [t.key, loadTarget(t.key)]));

function tally(r) {
  if (!r) return undefined;
  const c = (s) => r.checks.filter((x) => x.status === s).length;
  return { ok: c('SUCCESS'), fail: c('FAILURE'), warn: c('WARNING'), checks: r.checks };
}

function cell(key, name) {
  const t = data[key];
  if (!t.status.startsWith('ran')) return 'n/a';
  const r = tally(t.results.get(name));
  if (!r) return 'not run';
  const w = r.warn ? `, ${r.warn} warn` : '';
  if (r.fail === 0) return `pass (${r.ok}/${r.ok}${w})`;
  return `**FAIL** (${r.ok}/${r.ok + r.fail}${w})`;
}

const oneLine = (s) => String(s ?? '').replace(/\s+/g, ' ').replace(/\|/g, '\\|').trim();
const clip = (s, n = 200) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);

// Verdict checks by id (the traffic log of incoming/outgoing messages left
// out), for the direct/through comparison.
function statusById(r) {
  const m = new Map();
  for (const c of r?.checks ?? []) if (!/^(incoming|outgoing)-/.test(c.id) && c.id !== 'stream-closed') m.set(c.id, c);
  return m;
}

/** Scenarios worse through `key` than direct, and checks whose status differs. */
function compare(key) {
  const worse = [];
  const differs = [];
  if (!data[key].status.startsWith('ran') || !data.direct.status.startsWith('ran')) return { worse, differs };
  for (const name of scenarios) {
    const d = tally(data.direct.results.get(name));
    const t = tally(data[key].results.get(name));
    if (!d) continue;
    if (!t) {
      worse.push({ name, why: 'did not run through mcpyard' });
      continue;
    }
    if (t.fail > d.fail) worse.push({ name, why: `${t.fail} failed check(s) through mcpyard, ${d.fail} direct` });
    const dm = statusById(data.direct.results.get(name));
    const tm = statusById(data[key].results.get(name));
    for (const id of new Set([...dm.keys(), ...tm.keys()])) {
      const a = dm.get(id);
      const b = tm.get(id);
      if (a?.status !== b?.status && (a?.status ?? 'INFO') + (b?.status ?? 'INFO') !== 'INFOINFO') {
        differs.push({
          name,
          id,
          direct: a?.status ?? '—',
          through: b?.status ?? '—',
          msg: clip(oneLine(b?.errorMessage ?? b?.details?.message ?? a?.errorMessage ?? '')),
        });
      }
    }
  }
  return { worse, differs };
}
const compared = Object.fromEntries(GATEWAYS.map((t) => [t.key, compare(t.key)]));
const worse = GATEWAYS.flatMap((t) => compared[t.key].worse.map((w) => ({ ...w, via: t.title })));

const lines = [];
const meta = existsSync(join(rawDir, 'meta.txt')) ? readFileSync(join(rawDir, 'meta.txt'), 'utf8').trim() : '';
lines.push('# MCP conformance: server scenarios', '');
lines.push('Written by `tests/conformance/run.sh`; see `tests/conformance/README.md`.');
if (meta) lines.push('', ...meta.split('\n').map((l) => `- ${l}`));
lines.push('');
for (const t of TARGETS) lines.push(`- ${t.title}: ${data[t.key].status}`);
lines.push('');
lines.push('A cell reads pass/FAIL (SUCCESS checks / SUCCESS+FAILURE checks, warnings). A scenario fails when one');
lines.push('of its checks fails; warnings are SHOULD-level and do not fail it. *pending* marks scenarios');
lines.push("the suite keeps out of its default (active) suite.");
lines.push('');
lines.push(`| scenario | ${TARGETS.map((t) => t.title).join(' | ')} |`);
lines.push(`|---|${TARGETS.map(() => '---').join('|')}|`);
const count = Object.fromEntries(TARGETS.map((t) => [t.key, { pass: 0, fail: 0 }]));
for (const name of scenarios) {
  const pending = TARGETS.some((t) => data[t.key].results.get(name)?.suite === 'pending');
  const row = TARGETS.map((t) => {
    const r = tally(data[t.key].results.get(name));
    if (r && data[t.key].status.startsWith('ran')) count[t.key][r.fail === 0 ? 'pass' : 'fail']++;
    return cell(t.key, name);
  });
  lines.push(`| ${name}${pending ? ' *(pending)*' : ''} | ${row.join(' | ')} |`);
}
lines.push(
  `| **scenarios passed** | ${TARGETS.map((t) => (data[t.key].status.startsWith('ran') ? `${count[t.key].pass}/${count[t.key].pass + count[t.key].fail}` : 'n/a')).join(' | ')} |`,
);
lines.push('');

for (const g of GATEWAYS) {
  const { worse: gWorse, differs } = compared[g.key];
  lines.push(`## ${g.title} vs. direct`, '');
  if (!data[g.key].status.startsWith('ran')) {
    lines.push(`Not compared: the run was ${data[g.key].status}.`);
  } else if (!data.direct.status.startsWith('ran')) {
    lines.push(`Not compared: the direct run was ${data.direct.status}.`);
  } else {
    if (gWorse.length === 0) lines.push('No scenario is worse through mcpyard than direct.');
    else {
      lines.push('Worse through mcpyard (this makes run.sh exit 1):', '');
      for (const w of gWorse) lines.push(`- ${w.name}: ${w.why}`);
    }
    lines.push('');
    if (differs.length === 0) lines.push('Every SUCCESS, WARNING and FAILURE check has the same status in both runs.');
    else {
      lines.push('Checks whose status differs (— = check absent; INFO-only changes left out):', '');
      lines.push('| scenario | check | direct | through mcpyard | message |', '|---|---|---|---|---|');
      for (const d of differs) lines.push(`| ${d.name} | ${d.id} | ${d.direct} | ${d.through} | ${d.msg} |`);
    }
  }
  lines.push('');
}

function reasons(key, title) {
  const t = data[key];
  if (!t.status.startsWith('ran')) return;
  const rows = [];
  for (const name of scenarios) {
    const r = t.results.get(name);
    for (const c of r?.checks ?? []) {
      if (c.status === 'FAILURE' || c.status === 'WARNING') {
        rows.push(`| ${name} | ${c.status} | ${c.id} | ${clip(oneLine(c.errorMessage ?? c.details?.message ?? ''))} |`);
      }
    }
    // A scenario with no SUCCESS and no FAILURE check "passes" without testing
    // anything; its INFO verdicts (not the traffic log) say why.
    const t2 = tally(r);
    if (t2 && t2.ok === 0 && t2.fail === 0) {
      for (const c of r.checks) {
        if (c.status === 'INFO' && !/^(incoming|outgoing)-/.test(c.id) && c.id !== 'stream-closed') {
          rows.push(`| ${name} | INFO | ${c.id} | ${clip(oneLine(c.details?.message ?? c.errorMessage ?? c.description))} |`);
        }
      }
    }
  }
  lines.push(`## ${title}: failures, warnings, and why a check-less pass passed`, '');
  if (rows.length === 0) lines.push('None.');
  else lines.push('| scenario | status | check | message |', '|---|---|---|---|', ...rows);
  lines.push('');
}
for (const t of TARGETS) reasons(t.key, t.title);

writeFileSync(outMd, `${lines.join('\n')}\n`);
for (const t of TARGETS) {
  const c = count[t.key];
  console.log(`${t.title}: ${data[t.key].status.startsWith('ran') ? `${c.pass} passed, ${c.fail} failed` : data[t.key].status}`);
}
if (worse.length > 0) {
  console.log(`worse through mcpyard than direct: ${worse.map((w) => `${w.name} (${w.via})`).join(', ')}`);
  process.exit(1);
}
