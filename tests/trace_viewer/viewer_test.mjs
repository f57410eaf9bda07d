// Loads a backplane trace (docs/tracing.md) into speedscope, a viewer of the Trace Event Format
// not written here, in headless Chromium, and checks what it shows:
//
//   - the import ends without an error: no "Something went wrong" screen, no alert ("Unrecognized
//     format", "imported ... but it's empty"), no error on the page's console or thrown by its
//     scripts, and no warning from speedscope's importer (it warns when spans on a thread do not nest,
//     and then draws them wrongly);
//   - every rank is shown: speedscope makes one profile per (pid, tid) and names it from the
//     process_name and thread_name metadata, "rank 0 · cpu:0 (pid 0), backplane 4711 (tid 4711)";
//     each rank of the job (otherData.backplane_trace.ranks, at least --expect-ranks of them) has a
//     profile named after its process track, the profile opens, and its table of spans (the
//     Sandwich view) names each --expect-span.
//
//   node viewer_test.mjs TRACE.json [--expect-ranks N] [--expect-span NAME]... [--screenshot OUT.png]
//
// --screenshot also saves OUT.png (1400x800): rank 0's timeline zoomed to three training steps
// (docs/images/trace-speedscope.png is made this way; the toolbar's icons need an emoji font,
// Debian's fonts-noto-color-emoji).
//
// speedscope's built app (node_modules/speedscope/dist/release) and the trace are served over HTTP on
// 127.0.0.1 at a free port; Chromium is Debian's (package chromium), driven by playwright-core. Both
// npm packages are pinned in package-lock.json; scripts/install-deps.sh runs `npm ci` here.
// Exit status: 0 passed, 1 failed (each failure printed), 77 skipped (no Chromium or no node_modules).

import fs from 'node:fs'
import http from 'node:http'
import path from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
const IMPORT_TIMEOUT_MS = 60000

function usage(message) {
  if (message) console.error(`viewer_test: ${message}`)
  console.error('usage: node viewer_test.mjs TRACE.json [--expect-ranks N] [--expect-span NAME]... [--screenshot OUT.png]')
  process.exit(2)
}

function skip(reason) {
  console.log(`skipped: ${reason}`)
  process.exit(77)
}

function parseArgs(argv) {
  const args = { trace: null, expectRanks: 1, expectSpans: [], screenshot: null }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === '--expect-ranks') {
      args.expectRanks = Number(argv[++i])
      if (!Number.isInteger(args.expectRanks) || args.expectRanks < 1) usage('--expect-ranks takes a count of ranks')
    } else if (a === '--expect-span') {
      const name = argv[++i]
      if (!name) usage('--expect-span takes a span name')
      args.expectSpans.push(name)
    } else if (a === '--screenshot') {
      args.screenshot = argv[++i]
      if (!args.screenshot) usage('--screenshot takes a file name')
    } else if (a.startsWith('-')) {
      usage(`unknown option ${a}`)
    } else if (args.trace === null) {
      args.trace = a
    } else {
      usage(`one trace file only (got ${args.trace} and ${a})`)
    }
  }
  if (args.trace === null) usage('no trace file given')
  return args
}

// Debian's chromium package: the browser binary itself (its /usr/bin/chromium is a shell wrapper).
function findChromium() {
  for (const candidate of ['/usr/lib/chromium/chromium', '/usr/bin/chromium', '/usr/bin/chromium-browser']) {
    try {
      fs.accessSync(candidate, fs.constants.X_OK)
      return candidate
    } catch {}
  }
  return null
}

// What the trace says the viewer must show: each rank with its process track's name, and rank 0's
// steps (for the screenshot), from the file itself.
function readTrace(file) {
  let doc
  try {
    doc = JSON.parse(fs.readFileSync(file, 'utf8'))
  } catch (e) {
    console.error(`FAIL: ${file} is not a JSON document: ${e.message}`)
    process.exit(1)
  }
  const events = Array.isArray(doc) ? doc : doc.traceEvents
  if (!Array.isArray(events)) {
    console.error(`FAIL: ${file} has no traceEvents array`)
    process.exit(1)
  }
  const processNames = new Map()
  for (const e of events) {
    if (e.ph === 'M' && e.name === 'process_name' && e.args && typeof e.args.name === 'string') {
      processNames.set(e.pid, e.args.name)
    }
  }
  const listed = doc.otherData?.backplane_trace?.ranks
  const rankIds = Array.isArray(listed) ? listed.map(r => r.rank) : [...processNames.keys()]
  const ranks = rankIds.sort((a, b) => a - b).map(rank => ({ rank, name: processNames.get(rank) ?? null }))
  const spans = events.filter(e => e.ph === 'X' && e.pid === 0)
  return { ranks, spans }
}

function serve(root, tracePath) {
  const types = {
    '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css',
    '.json': 'application/json', '.png': 'image/png', '.ico': 'image/x-icon', '.woff2': 'font/woff2',
    '.wasm': 'application/wasm', '.txt': 'text/plain',
  }
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://127.0.0.1')
    let file
    if (url.pathname === '/trace/job.json') {
      file = tracePath
    } else {
      file = path.join(root, url.pathname === '/' ? 'index.html' : decodeURIComponent(url.pathname))
      if (!file.startsWith(root + path.sep)) file = null
    }
    if (file === null) {
      res.writeHead(404).end()
      return
    }
    fs.readFile(file, (err, data) => {
      if (err) {
        res.writeHead(404).end()
      } else {
        res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream' }).end(data)
      }
    })
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve(server))
  })
}

// The toolbar's middle: the profile shown, with its place when there are several:
// "rank 0 · cpu:0 (pid 0), backplane 4711 (tid 4711) (1/2)". null before a profile is shown.
async function shownProfile(page) {
  return page.evaluate(() => {
    // The toolbar: the view buttons, the profile's name (and place, with several profiles: an element
    // whose first child it is, the hidden selector following), the Export... buttons.
    const toolbar = [...document.querySelectorAll('div')].find(d => d.childNodes.length >= 3 &&
      d.firstElementChild.textContent.includes('Time Order') && d.lastElementChild.textContent.includes('Export'))
    const middle = toolbar ? [...toolbar.childNodes].slice(1, -1) : []
    const text = middle.map(n => (n.nodeType === Node.ELEMENT_NODE ? n.firstElementChild ?? n : n).textContent).join('').trim()
    if (!text) return null
    const m = /^(.*) \((\d+)\/(\d+)\)$/.exec(text)
    return m ? { name: m[1], index: Number(m[2]), count: Number(m[3]) } : { name: text, index: 1, count: 1 }
  })
}

// The profile shown once `ready(shown)` holds, or null after 10 s.
async function waitShown(page, ready) {
  for (const deadline = Date.now() + 10000; Date.now() < deadline; await page.waitForTimeout(50)) {
    const shown = await shownProfile(page)
    if (shown !== null && ready(shown)) return shown
  }
  return null
}

async function main() {
  const args = parseArgs(process.argv.slice(2))
  const tracePath = path.resolve(args.trace)
  const root = path.join(here, 'node_modules', 'speedscope', 'dist', 'release')
  const playwrightEntry = path.join(here, 'node_modules', 'playwright-core', 'index.mjs')
  if (!fs.existsSync(path.join(root, 'index.html')) || !fs.existsSync(playwrightEntry)) {
    skip(`speedscope or playwright-core is not installed in ${here}/node_modules (run npm ci there; scripts/install-deps.sh does)`)
  }
  const executablePath = findChromium()
  if (executablePath === null) skip('no Chromium (Debian package chromium; scripts/install-deps.sh installs it)')
  const { chromium } = await import(pathToFileURL(playwrightEntry).href)

  const trace = readTrace(tracePath)
  const failures = []
  if (trace.ranks.length < args.expectRanks) {
    failures.push(`the trace lists ${trace.ranks.length} rank(s), expected ${args.expectRanks}`)
  }
  for (const r of trace.ranks) {
    if (r.name === null) failures.push(`the trace has no process_name for rank ${r.rank} (pid ${r.rank})`)
  }

  const server = await serve(root, tracePath)
  const base = `http://127.0.0.1:${server.address().port}/`
  const browser = await chromium.launch({ executablePath, headless: true })
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 800 } })
    const problems = []
    page.on('dialog', dialog => {
      problems.push(`speedscope said: ${dialog.message()}`)
      dialog.dismiss().catch(() => {})
    })
    page.on('pageerror', err => problems.push(`the page threw: ${err.message}`))
    page.on('console', msg => {
      const text = msg.text()
      if (msg.type() === 'error') problems.push(`console error: ${text}`)
      // speedscope's importer warns when spans do not nest ("Tried to end ...", "... still open at
      // end of profile"); Chromium's own GL driver messages are not about the trace.
      else if (msg.type() === 'warning' && !/GL Driver Message|WebGL/.test(text)) problems.push(`console warning: ${text}`)
      else if (msg.type() === 'log' && /^Failed to load format/.test(text)) problems.push(`console: ${text}`)
    })
    page.on('requestfailed', req => problems.push(`request failed: ${req.url()} (${req.failure()?.errorText})`))
    page.on('response', res => {
      if (res.status() >= 400) problems.push(`HTTP ${res.status()} for ${res.url()}`)
    })

    const start = Date.now()
    await page.goto(`${base}#profileURL=${encodeURIComponent(`${base}trace/job.json`)}`)
    // Imported: the document's title becomes "job.json - speedscope" and the toolbar names the profile
    // shown; failed: the error screen, or an alert (recorded above; speedscope stops loading).
    let state
    try {
      const handle = await page.waitForFunction(() => {
        if (document.body.innerText.includes('Something went wrong')) return 'error screen'
        return / - speedscope$/.test(document.title) ? 'imported' : false
      }, null, { timeout: IMPORT_TIMEOUT_MS, polling: 100 })
      state = await handle.jsonValue()
    } catch {
      state = problems.length > 0 ? 'failed' : `not imported after ${IMPORT_TIMEOUT_MS / 1000} s`
    }
    const importMs = Date.now() - start
    const first = state === 'imported' ? await waitShown(page, shown => shown.index === 1) : null
    if (state === 'imported' && first === null) state = 'imported, but no profile is shown'
    if (state !== 'imported') failures.push(`speedscope did not import the trace: ${state}`)

    // The profiles speedscope made: with several, the selector lists them (each row's title is a
    // profile's name); with one, the toolbar names it.
    let profiles = []
    const contents = new Map()
    if (first !== null) {
      const rows = await page.evaluate(() => [...document.querySelectorAll('tr[title]')].map(tr => tr.getAttribute('title')))
      profiles = rows.length > 0 ? rows : [first.name]
      // Open each in turn in the Sandwich view ('3'; 'n': the next profile), a table of the profile's
      // span names, and read them; then back to rank 0's in the Time Order view ('p', '1').
      await page.keyboard.press('3')
      for (let i = 1; i <= first.count; i++) {
        if (i > 1) await page.keyboard.press('n')
        const shown = await waitShown(page, shown => shown.index === i)
        if (shown === null) break
        await page.waitForFunction(() => document.querySelectorAll('td').length > 0, null, { timeout: 10000 }).catch(() => {})
        // The table fills in over more than one frame: read it once the expected spans are in it (or
        // after 10 s, and then report what is missing), not at its first row.
        await page.waitForFunction(spans => {
          const names = [...document.querySelectorAll('td')].map(td => td.textContent.trim())
          return spans.every(span => names.some(n => n === span || n.startsWith(`${span} {`)))
        }, args.expectSpans, { timeout: 10000 }).catch(() => {})
        contents.set(shown.name, await page.evaluate(() => [...document.querySelectorAll('td')].map(td => td.textContent.trim())))
      }
      for (let i = 1; i < first.count; i++) await page.keyboard.press('p')
      await page.keyboard.press('1')
    }
    if (state === 'imported') {
      for (const r of trace.ranks) {
        if (r.name === null) continue
        const profile = profiles.find(p => p.startsWith(`${r.name} (pid ${r.rank})`))
        if (!profile) {
          failures.push(`no profile for rank ${r.rank} ("${r.name}"); speedscope shows: ${profiles.map(p => `"${p}"`).join(', ')}`)
          continue
        }
        const names = contents.get(profile)
        if (!names) {
          failures.push(`the profile of rank ${r.rank} ("${profile}") is listed but did not open`)
          continue
        }
        for (const span of args.expectSpans) {
          // speedscope names a span by its name and its args as JSON: 'all_reduce {"device":"cpu:0",...}'.
          if (!names.some(n => n === span || n.startsWith(`${span} {`))) {
            failures.push(`rank ${r.rank}'s profile shows no "${span}" span`)
          }
        }
      }
    }
    failures.push(...problems)

    if (failures.length === 0) {
      console.log(`speedscope imported ${path.basename(tracePath)} in ${importMs} ms: ${profiles.length} profile(s)`)
      for (const p of profiles) console.log(`  ${p}`)
    }
    if (args.screenshot && failures.length === 0) {
      await screenshot(page, trace, args.screenshot)
      console.log(`screenshot: ${args.screenshot}`)
    }
  } finally {
    await browser.close()
    server.close()
  }

  if (failures.length > 0) {
    for (const f of failures) console.log(`FAIL: ${f}`)
    process.exit(1)
  }
  console.log(`ok: every rank (${trace.ranks.map(r => r.rank).join(', ')}) is shown, imported without error`)
}

// Rank 0's timeline zoomed to three steps: the minimap (the strip above the timeline, drawn over the
// whole profile) is dragged across them, after a zoom elsewhere so that the drag starts outside the
// shown range (a drag inside it would move it instead).
async function screenshot(page, trace, out) {
  // speedscope starts each profile at its thread's first event (rank 0 records on one thread).
  const t0 = Math.min(...trace.spans.map(e => e.ts))
  const t1 = Math.max(...trace.spans.map(e => e.ts + (e.dur ?? 0)))
  const steps = trace.spans.filter(e => e.cat === 'range' && e.name === 'step').sort((a, b) => a.ts - b.ts)
  if (steps.length < 5) throw new Error(`rank 0 has ${steps.length} steps, the screenshot needs 5`)
  const first = steps[2]
  const last = steps[4]
  const margin = (last.ts + last.dur - first.ts) * 0.02
  const from = first.ts - margin - t0
  const to = last.ts + last.dur + margin - t0

  const canvases = await page.evaluate(() =>
    [...document.querySelectorAll('canvas')].map(c => {
      const r = c.getBoundingClientRect()
      return { x: r.x, y: r.y, width: r.width, height: r.height }
    }))
  // The page-wide canvas speedscope draws with, the minimap and the timeline under it.
  const [minimap, chart] = canvases.filter(c => c.y > 0).sort((a, b) => a.y - b.y)
  const chartY = chart.y + chart.height / 2
  await page.mouse.move(chart.x + 5, chartY)
  await page.keyboard.down('Control')
  for (let i = 0; i < 10; i++) await page.mouse.wheel(0, -100)
  await page.keyboard.up('Control')

  const xOf = t => minimap.x + (t / (t1 - t0)) * minimap.width
  const y = minimap.y + minimap.height / 2
  await page.mouse.move(xOf(from), y)
  await page.mouse.down()
  await page.mouse.move(xOf(to), y, { steps: 10 })
  await page.mouse.up()

  // The pointer off the timeline, so that no hover box hides a span.
  await page.mouse.move(minimap.x + 1, minimap.y + 1)
  await page.waitForTimeout(300)
  const shown = await shownProfile(page)
  if (!shown || shown.index !== 1) throw new Error(`the screenshot is of profile ${JSON.stringify(shown)}, not rank 0's`)
  await page.screenshot({ path: out })
}

main().catch(err => {
  console.log(`FAIL: ${err.stack ?? err}`)
  process.exit(1)
})
