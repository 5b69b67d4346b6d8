// The web server of the rooflab book theme. `myst build --html` starts it with
// CONTENT_CDN_PORT (where mystmd serves the built pages and config.json) and PORT, fetches
// every page from it and saves the answers as a static site; `myst start` uses it live.
// Node's standard library only: nothing to install, and the pages carry no JavaScript.
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { render, escape, joined } = require('./render.js');

const HOST = process.env.HOST || 'localhost';
const PORT = Number(process.env.PORT || 3000);
const CONTENT = `http://localhost:${process.env.CONTENT_CDN_PORT || 3100}`;
const BASE = (process.env.BASE_URL || '').replace(/\/$/, '');
const PUBLIC = path.join(__dirname, 'public');
// Outputs of a recorded run of each lab, laid on the learner's cells (`make record`).
const RECORDED = path.join(__dirname, '..', 'recorded');
const TYPES = { '.css': 'text/css', '.svg': 'image/svg+xml', '.png': 'image/png',
  '.json': 'application/json', '.ipynb': 'application/json', '.md': 'text/markdown' };

async function fetchJson(route) {
  const response = await fetch(CONTENT + route);
  if (!response.ok) return null;
  return response.json();
}

// The pages in reading order, from the site's table of contents: the index, then every
// page with a slug; entries without one are the headings of the parts.
function contents(config) {
  const project = config.projects[0];
  const index = { slug: project.index, title: project.title, level: 1 };
  return { project, index, pages: [index, ...project.pages.filter((p) => p.slug)] };
}

function pageUrl(slug, indexSlug) {
  return slug === indexSlug ? `${BASE}/` : `${BASE}/${slug.replace(/\./g, '/')}`;
}

function navigation(project, index, current) {
  const items = [`<li class="nav-home${current === index.slug ? ' current' : ''}">`
    + `<a href="${pageUrl(index.slug, index.slug)}">Start here</a></li>`];
  for (const page of project.pages) {
    if (!page.slug) {
      items.push(`<li class="nav-part">${escape(page.title)}</li>`);
      continue;
    }
    const here = page.slug === current ? ' class="current" aria-current="page"' : '';
    items.push(`<li${here}><a href="${pageUrl(page.slug, index.slug)}">${escape(page.title)}</a></li>`);
  }
  return `<nav class="toc" aria-label="Contents"><ul>${items.join('')}</ul></nav>`;
}

// Where a lab's launch button points: ROOFLAB_JUPYTERLAB_URL when the book is built, else
// the site option jupyterlab_url of myst.yml; the notebook's file name is appended. Empty
// or "none": no button.
function launchBase(options) {
  const setting = (process.env.ROOFLAB_JUPYTERLAB_URL ?? options.jupyterlab_url ?? '').trim();
  return setting === '' || setting.toLowerCase() === 'none' ? null : setting;
}

// The address's host ('localhost:8888'), or the address itself where it has none.
function hostOf(base) {
  try {
    return new URL(base).host || base;
  } catch {
    return base;
  }
}

function isLocal(base) {
  return /^(localhost|127\.0\.0\.1|\[::1\])(:|$)/.test(hostOf(base));
}

function whereItRuns(base, filename) {
  if (!base) {
    return `<p>Run it in JupyterLab: <code>make lab</code> in a clone of the course starts
one on your machine, with <code>${escape(filename)}</code> in its folder of labs.</p>`;
  }
  const host = escape(hostOf(base));
  if (isLocal(base)) {
    return `<p>The button opens the lab in the JupyterLab that <code>make lab</code> starts on
your machine (at <code>${host}</code>; paste the token it prints if JupyterLab asks for one).</p>`;
  }
  return `<p>The button opens the lab in the course's JupyterLab at <code>${host}</code>; sign
in there if it asks.</p>`;
}

// A recorded notebook's outputs, by the code of their cell: a cell whose code changed since
// the recording finds none, and shows none. Cells of the same code take theirs in order.
function recordedOutputs(notebook) {
  const byCode = new Map();
  for (const cell of notebook.cells || []) {
    if (cell.cell_type !== 'code') continue;
    const code = joined(cell.source).trimEnd();
    byCode.set(code, [...(byCode.get(code) || []), cell.outputs || []]);
  }
  const about = ((notebook.metadata || {}).rooflab || {}).recorded || {};
  return { about, outputsFor: (code) => (byCode.get(code.trimEnd()) || []).shift() || [] };
}

// The recording of a lab (book/recorded/<its notebook>), or null where it has none.
function recording(filename) {
  const file = path.join(RECORDED, path.basename(filename));
  if (!fs.existsSync(file)) return null;
  return recordedOutputs(JSON.parse(fs.readFileSync(file, 'utf8')));
}

// Where the outputs on the page come from: a headline a learner can trust, then its detail.
function recordedOn(about) {
  const when = about.date ? ` on ${escape(about.date)}` : '';
  if (about.measured) {
    return [`Recorded on ${escape(about.name || 'a GPU')}${when}: times measured on that card.`,
      'Yours will differ on another card.'];
  }
  return [`Recorded on a CPU${when}: times are predictions.`, `Nothing was timed: the kernels
ran in Triton's interpreter, and the course's model predicted their speed on a GPU.`];
}

function outputsNote(record) {
  if (!record) {
    return `<p>This page is the notebook as you get it, without outputs: the charts, the
widgets and the check cards appear when you run it.</p>`;
  }
  const [headline, detail] = recordedOn(record.about);
  return `<p class="recorded"><strong>${headline}</strong> ${detail} The outputs are those of a
run with every exercise solved: your own run shows the same charts and check cards once your
code passes. Widgets are still pictures here.</p>`;
}

// A lab is a notebook: its page opens with where to run it, and where its outputs come from.
function launchBox(frontmatter, options, record) {
  const notebook = (frontmatter.exports || []).find((e) => e.format === 'ipynb');
  if (!frontmatter.kernelspec || !notebook) return '';
  const base = launchBase(options);
  const button = base ? `<a class="launch-link" href="${escape(base + notebook.filename)}">`
    + `Open ${escape(notebook.filename)} in JupyterLab</a>\n` : '';
  return `<aside class="launch" aria-label="Run this lab">
<p>${button}<a class="download" href="${escape(BASE + '/build' + notebook.url)}" download="${escape(notebook.filename)}">Download the notebook</a></p>
${whereItRuns(base, notebook.filename)}
${outputsNote(record)}
</aside>`;
}

function layout({ title, siteTitle, nav, body, pager, description }) {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escape(title === siteTitle ? title : `${title} — ${siteTitle}`)}</title>
${description ? `<meta name="description" content="${escape(description)}">` : ''}
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${BASE}/myst-theme.css">
</head>
<body>
<header class="site"><a href="${BASE}/">${escape(siteTitle)}</a></header>
<div class="page">
${nav}
<main>
<article>
${body}
</article>
${pager}
</main>
</div>
</body>
</html>
`;
}

async function page(slug) {
  const config = await fetchJson('/config.json');
  if (!config) return null;
  const { project, index, pages } = contents(config);
  slug = slug || index.slug;
  const data = await fetchJson(`/content/${slug}.json`);
  if (!data) return null;
  const frontmatter = data.frontmatter || {};
  const title = frontmatter.title || project.title;
  const siteTitle = config.title || project.title;
  const notebook = (frontmatter.exports || []).find((e) => e.format === 'ipynb');
  const record = frontmatter.kernelspec && notebook ? recording(notebook.filename) : null;
  const ctx = { base: BASE, outputsFor: record ? record.outputsFor : null };
  const body = `<h1>${escape(title)}</h1>\n${launchBox(frontmatter, config.options || {}, record)}\n`
    + render(data.mdast, ctx);
  const at = pages.findIndex((p) => p.slug === slug);
  const link = (p, rel) => p ? `<a rel="${rel}" href="${pageUrl(p.slug, index.slug)}">`
    + `<span>${rel === 'prev' ? 'Previous' : 'Next'}</span>${escape(p.title)}</a>` : '<span></span>';
  const pager = `<nav class="pager">${link(pages[at - 1], 'prev')}${link(pages[at + 1], 'next')}</nav>`;
  return layout({ title, siteTitle, nav: navigation(project, index, slug), body, pager,
    description: frontmatter.description });
}

async function proxy(route, res) {
  const response = await fetch(CONTENT + route);
  if (!response.ok) return false;
  const type = TYPES[path.extname(route)] || response.headers.get('content-type');
  res.writeHead(200, { 'Content-Type': type || 'application/octet-stream' });
  res.end(Buffer.from(await response.arrayBuffer()));
  return true;
}

function publicFile(route) {
  const file = path.join(PUBLIC, path.normalize(route).replace(/^(\.\.[/\\])+/, ''));
  return file.startsWith(PUBLIC) && fs.existsSync(file) && fs.statSync(file).isFile() ? file : null;
}

const EXTRA = {
  '/robots.txt': ['text/plain', 'User-agent: *\nAllow: /\n'],
  '/favicon.ico': ['image/x-icon', ''],
  '/sitemap.xml': ['application/xml', '<?xml version="1.0" encoding="UTF-8"?>\n'
    + '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>\n'],
  '/sitemap_style.xsl': ['application/xml', '<?xml version="1.0" encoding="UTF-8"?>\n'
    + '<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform"/>\n'],
};

async function handle(req, res) {
  let route = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
  if (BASE && route.startsWith(BASE)) route = route.slice(BASE.length) || '/';
  const file = publicFile(route);
  if (file) {
    res.writeHead(200, { 'Content-Type': TYPES[path.extname(file)] || 'application/octet-stream' });
    return res.end(fs.readFileSync(file));
  }
  if (EXTRA[route]) {
    res.writeHead(200, { 'Content-Type': EXTRA[route][0] });
    return res.end(EXTRA[route][1]);
  }
  if (route.startsWith('/build/') && await proxy(route.slice('/build'.length), res)) return;
  if (route.endsWith('.json') && await proxy(`/content${route}`, res)) return;
  const slug = route.replace(/^\/+|\/+$/g, '').replace(/\//g, '.');
  const html = await page(slug);
  res.writeHead(html ? 200 : 404, { 'Content-Type': 'text/html; charset=utf-8' });
  res.end(html || '<!DOCTYPE html><title>Not found</title><p>No such page.</p>');
}

function serve() {
  // mystmd gives this server a pipe for stdin and holds it open while it runs. `myst build
  // --html` exits as soon as the pages are written, without waiting for this server to
  // stop: the pipe then closes, and the server goes with it.
  if (!process.stdin.isTTY) {
    process.stdin.on('end', () => process.exit(0));
    process.stdin.on('error', () => process.exit(0));
    process.stdin.resume();
  }
  http.createServer((req, res) => {
    handle(req, res).catch((error) => {
      console.error(error);
      res.writeHead(500, { 'Content-Type': 'text/plain' });
      res.end(String(error));
    });
  }).listen(PORT, HOST, () => {
    // mystmd waits for a line with the address before it starts fetching pages.
    console.log(`rooflab book theme at http://${HOST}:${PORT}`);
  });
}

if (require.main === module) serve();

module.exports = { launchBox, launchBase, recording, recordedOutputs };
