// The page's player: draws the plotly figures the page carries as JSON, and keeps each episode's videos and plot
// cursors on one clock, the first camera's video (an index holds no episode without a camera). Text from the dataset
// is never put into the page by this script: it is in the HTML already, escaped where the page was written.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("episodepipes-data").textContent);
  var show = { ready: false, episodes: [] };
  window.episodepipesShow = show;
  var config = { responsive: true, displaylogo: false };
  var REDRAW_MS = 100;
  var pending = [];

  function draw(id, fig) {
    var drawn = Plotly.newPlot(id, fig.data, fig.layout, config);
    pending.push(drawn);
    return drawn;
  }

  function player(root, ep) {
    var videos = Array.prototype.slice.call(root.querySelectorAll("video"));
    var button = root.querySelector("button.play");
    var scrub = root.querySelector("input.scrub");
    var readout = root.querySelector("span.time");
    var plots = ep.plots.map(function (p) { return p.id; });
    var duration = ep.frames / ep.fps;
    var shown = -1, moving = false, drawn = 0;
    var visible = {};  // plot id -> whether it is on screen (unknown: drawn)
    if (window.IntersectionObserver) {
      var watch = new IntersectionObserver(function (entries) {
        entries.forEach(function (en) { visible[en.target.id] = en.isIntersecting; });
      });
      plots.forEach(function (id) { watch.observe(document.getElementById(id)); });
    }

    function time() { return videos[0].currentTime; }
    function playing() { return !videos[0].paused && !videos[0].ended; }
    function play() { return Promise.all(videos.map(function (v) { return v.play(); })); }
    function pause() { videos.forEach(function (v) { v.pause(); }); }
    function seek(t) {
      t = Math.max(0, Math.min(duration, t));
      videos.forEach(function (v) { v.currentTime = t; });
    }
    function cursor() {
      return plots.map(function (id) { return document.getElementById(id).layout.shapes[0].x0; });
    }
    function tick() {
      var t = time();
      for (var k = 1; k < videos.length; k++) {  // the other cameras follow the first within a frame
        var v = videos[k];
        if (Math.abs(v.currentTime - t) > 1 / ep.fps) v.currentTime = t;
        if (v.paused !== videos[0].paused) { if (videos[0].paused) v.pause(); else v.play(); }
      }
      var now = performance.now(), live = playing();
      // a relayout redraws a plot's shapes: while playing, only the plots on screen, ten times a second (the page
      // stays responsive on a slow machine); paused or seeking, every plot at once, to the video's exact time
      if (t !== shown && !moving && (!live || now - drawn >= REDRAW_MS)) {
        drawn = now;
        scrub.value = t;
        readout.textContent = t.toFixed(2) + " s, frame " + Math.min(ep.frames - 1, Math.floor(t * ep.fps + 1e-6));
        var ids = live ? plots.filter(function (id) { return visible[id] !== false; }) : plots;
        if (!live) shown = t;
        moving = true;
        Promise.all(ids.map(function (id) {
          return Plotly.relayout(id, { "shapes[0].x0": t, "shapes[0].x1": t });
        })).then(function () { moving = false; }, function () { moving = false; });
      }
      button.textContent = playing() ? "pause" : "play";
      window.requestAnimationFrame(tick);
    }

    button.addEventListener("click", function () { if (playing()) pause(); else play(); });
    scrub.max = duration;
    scrub.step = 1 / ep.fps;
    scrub.addEventListener("input", function () { pause(); seek(parseFloat(scrub.value)); });
    Promise.all(ep.plots.map(function (p) {
      return draw(p.id, p.figure).then(function (gd) {
        gd.on("plotly_click", function (e) { if (e.points.length) { pause(); seek(e.points[0].x); } });
      });
    })).then(function () { window.requestAnimationFrame(tick); });  // the cursors exist once the plots do
    return { videos: videos, plots: plots, time: time, cursor: cursor, play: play, pause: pause, seek: seek };
  }

  Object.keys(data.summary).forEach(function (id) { draw(id, data.summary[id]); });
  data.episodes.forEach(function (ep, i) {
    show.episodes.push(player(document.getElementById("episode-" + i), ep));
  });
  Promise.all(pending).then(function () { show.ready = true; });
})();
