// MyST's AST (as `myst build` writes it, one JSON file per page) to HTML.
//
// Only what the course's pages use is rendered with care: prose, tables, code, math,
// admonitions, <details>, images and notebook cells. An unknown node renders its children,
// so new syntax degrades to its text rather than disappearing.
'use strict';

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

function escape(text) {
  return String(text ?? '').replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Python, coloured token by token: comments, strings, decorators, keywords, numbers.
const PYTHON = new RegExp([
  /(#[^\n]*)/.source,
  /((?:\b[rRbBuUfF]{1,2})?(?:"""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))/.source,
  /(^[ \t]*@[\w.]+)/.source,
  /\b(and|as|assert|async|await|break|class|continue|def|del|elif|else|except|False|finally|for|from|global|if|import|in|is|lambda|None|nonlocal|not|or|pass|raise|return|True|try|while|with|yield)\b/.source,
  /\b(\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?)\b/.source,
].join('|'), 'gm');
const TOKEN_CLASSES = ['comment', 'string', 'decorator', 'keyword', 'number'];

function highlightPython(code) {
  let html = '';
  let last = 0;
  for (const match of code.matchAll(PYTHON)) {
    html += escape(code.slice(last, match.index));
    const group = match.slice(1).findIndex((g) => g !== undefined);
    html += `<span class="tok-${TOKEN_CLASSES[group]}">${escape(match[0])}</span>`;
    last = match.index + match[0].length;
  }
  return html + escape(code.slice(last));
}

function codeBlock(node) {
  const lang = (node.lang || '').toLowerCase();
  const python = lang === 'python' || lang === 'ipython3' || lang === 'ipython' || lang === 'py';
  const body = python ? highlightPython(node.value || '') : escape(node.value || '');
  return `<pre class="code"><code class="language-${escape(lang || 'text')}">${body}</code></pre>`;
}

function url(ctx, href) {
  if (!href) return '#';
  if (href.startsWith('/')) return ctx.base + href; // a page or file of this site
  return href;
}

function children(node, ctx) {
  return (node.children || []).map((child) => render(child, ctx)).join('');
}

function tableCell(node, ctx) {
  const tag = node.header ? 'th' : 'td';
  const align = node.align ? ` style="text-align: ${escape(node.align)}"` : '';
  return `<${tag}${align}>${children(node, ctx)}</${tag}>`;
}

function joined(value) {
  return Array.isArray(value) ? value.join('') : String(value ?? '');
}

function picture(mime, content, alt, size) {
  const base64 = mime === 'image/svg+xml' ? Buffer.from(joined(content)).toString('base64')
    : joined(content).replace(/\s/g, '');
  const dims = size && size.width && size.height
    ? ` width="${Number(size.width)}" height="${Number(size.height)}"` : '';
  return `<img class="chart" src="data:${mime};base64,${base64}" alt="${escape(alt)}"${dims}>`;
}

// One recorded output (see book/recorded/): text, a check card, or a chart drawn as SVG.
// The recording keeps only what a static page can show, and HTML without scripts.
function output(out) {
  if (out.output_type === 'stream') {
    return `<pre class="output stream ${escape(out.name)}">${escape(joined(out.text))}</pre>`;
  }
  const data = out.data || {};
  const alt = joined(data['text/plain']);
  for (const mime of ['image/svg+xml', 'image/png', 'image/jpeg']) {
    if (data[mime]) {
      return `<div class="output picture">${picture(mime, data[mime], alt, (out.metadata || {})[mime])}</div>`;
    }
  }
  if (data['text/html']) return `<div class="output html">${joined(data['text/html'])}</div>`;
  if (data['text/plain']) return `<pre class="output">${escape(alt)}</pre>`;
  return '';
}

function cell(node, ctx) {
  // A notebook code cell: its source, then the outputs recorded for this very code, if any.
  const tags = (node.data && node.data.tags) || [];
  const label = tags.includes('check') ? '<span class="cell-label">check</span>' : '';
  const code = (node.children || []).filter((c) => c.type === 'code');
  const recorded = ctx.outputsFor ? ctx.outputsFor(code.map((c) => c.value || '').join('\n')) : [];
  const outputs = recorded.length
    ? `<div class="outputs">${recorded.map(output).join('')}</div>` : '';
  return `<div class="cell">${label}${code.map(codeBlock).join('')}${outputs}</div>`;
}

function render(node, ctx) {
  switch (node.type) {
    case 'root':
      return children(node, ctx);
    case 'block':
      if (node.kind === 'notebook-code') return cell(node, ctx);
      return `<section class="block">${children(node, ctx)}</section>`;
    case 'text':
      return escape(node.value);
    case 'paragraph':
      return `<p>${children(node, ctx)}</p>`;
    case 'heading': {
      const id = node.html_id || node.identifier;
      const anchor = id ? ` <a class="anchor" href="#${escape(id)}" aria-hidden="true">#</a>` : '';
      const attr = id ? ` id="${escape(id)}"` : '';
      return `<h${node.depth}${attr}>${children(node, ctx)}${anchor}</h${node.depth}>`;
    }
    case 'emphasis':
      return `<em>${children(node, ctx)}</em>`;
    case 'strong':
      return `<strong>${children(node, ctx)}</strong>`;
    case 'delete':
      return `<del>${children(node, ctx)}</del>`;
    case 'subscript':
      return `<sub>${children(node, ctx)}</sub>`;
    case 'superscript':
      return `<sup>${children(node, ctx)}</sup>`;
    case 'inlineCode':
      return `<code>${escape(node.value)}</code>`;
    case 'code':
      return codeBlock(node);
    case 'break':
      return '<br>';
    case 'thematicBreak':
      return '<hr>';
    case 'blockquote':
      return `<blockquote>${children(node, ctx)}</blockquote>`;
    case 'list': {
      const tag = node.ordered ? 'ol' : 'ul';
      const start = node.ordered && node.start && node.start !== 1 ? ` start="${node.start}"` : '';
      return `<${tag}${start}>${children(node, ctx)}</${tag}>`;
    }
    case 'listItem':
      return `<li>${children(node, ctx)}</li>`;
    case 'link': {
      const external = /^https?:/.test(node.url || '');
      const rel = external ? ' rel="noopener"' : '';
      return `<a href="${escape(url(ctx, node.url))}"${rel}>${children(node, ctx)}</a>`;
    }
    case 'crossReference': {
      const href = node.url ? url(ctx, node.url) + (node.html_id ? `#${node.html_id}` : '')
        : `#${node.html_id || node.identifier || ''}`;
      return `<a href="${escape(href)}">${children(node, ctx)}</a>`;
    }
    case 'table':
      return `<div class="table"><table>${children(node, ctx)}</table></div>`;
    case 'tableRow':
      return `<tr>${children(node, ctx)}</tr>`;
    case 'tableCell':
      return tableCell(node, ctx);
    case 'inlineMath':
      return node.html ? `<span class="math">${node.html}</span>` : `<code>${escape(node.value)}</code>`;
    case 'math':
      return node.html ? `<div class="math display">${node.html}</div>` : codeBlock(node);
    case 'image': {
      const width = node.width ? ` style="width: ${escape(node.width)}"` : '';
      const alt = escape(node.alt || node.title || '');
      return `<img src="${escape(url(ctx, '/build' + node.url))}" alt="${alt}"${width}>`;
    }
    case 'container':
      return `<figure id="${escape(node.html_id || '')}">${children(node, ctx)}</figure>`;
    case 'caption':
      return `<figcaption>${children(node, ctx)}</figcaption>`;
    case 'admonition':
      return `<aside class="admonition ${escape(node.kind || 'note')}">${children(node, ctx)}</aside>`;
    case 'admonitionTitle':
      return `<p class="admonition-title">${children(node, ctx)}</p>`;
    case 'details':
      return `<details>${children(node, ctx)}</details>`;
    case 'summary':
      return `<summary>${children(node, ctx)}</summary>`;
    case 'html':
      return node.value || '';
    case 'outputs':
    case 'output':
    case 'comment':
    case 'mystComment':
    case 'mystTarget':
      return '';
    default:
      return node.children ? children(node, ctx) : escape(node.value || '');
  }
}

module.exports = { render, escape, highlightPython, output, joined };
