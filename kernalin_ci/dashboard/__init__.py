"""The dashboard: per kernel the timing series with HDI bands and change points, the verdict and
finding timeline, the badge; an overview of all kernels (docs/history.md).

    site.py     history runs -> HTML pages (data embedded as JSON; no network once built)
    assets.py   Chart.js, fetched from the npm registry by `npm pack` and checked, vendored into the site
    static/     the page's script and style
"""
