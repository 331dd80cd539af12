"""The report page's style: its stylesheet, inline in the page, and the Content-Security-Policy that allows no more.

The page runs no script and loads nothing: styles are inline and pictures are data: SVG, so the policy denies
everything else (a report is opened from a run's outputs, where a step's text could try to inject markup).

Nothing widens the page past a laptop's width: a long value in a table cell (a path, a JSON output) breaks
anywhere, and the DAG, drawn at its own size so that its labels read at 11-13 px, scrolls sideways in its box.
"""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;color:#222;margin:0;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:20px 24px 40px}
header{background:#fff;border-left:6px solid #999;padding:14px 20px;border-radius:8px;margin-bottom:16px}
header.Succeeded{border-color:#2e7d32}header.Failed,header.Error{border-color:#c62828}
header.Running{border-color:#1565c0}
h1{font-size:21px;margin:0 0 4px}h2{font-size:16px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px}
section{background:#fff;border-radius:8px;padding:14px 20px;margin-bottom:16px;box-shadow:0 1px 2px #0001}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
background:#8d8d8d}
.badge.Succeeded{background:#2e7d32}.badge.Failed,.badge.Error{background:#c62828}.badge.Running{background:#1565c0}
.muted{color:#666}.note{color:#555;font-style:italic}.bad{color:#c62828;font-weight:600}
.good{color:#2e7d32;font-weight:600}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{text-align:left;vertical-align:top;padding:5px 8px;border-bottom:1px solid #eee}
td{overflow-wrap:anywhere}
th{background:#fafafa;font-weight:600;font-size:12.5px;color:#444}
td.num{font-variant-numeric:tabular-nums;text-align:right;white-space:nowrap}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
.text{white-space:pre-wrap;word-break:break-word;max-height:12em;overflow:auto;
font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:16px}.charts svg{flex:1 1 380px;max-width:560px}
.scroll{overflow-x:auto}svg.dag{display:block}
.decision{padding:8px 12px;border-radius:6px;margin:8px 0;font-weight:600}
.decision.pass{background:#e8f5e9;color:#1b5e20}.decision.fail{background:#ffebee;color:#b71c1c}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:3px;margin-right:4px;vertical-align:-1px}
details summary{cursor:pointer;color:#1565c0}
footer{color:#777;font-size:12px;text-align:center}
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
