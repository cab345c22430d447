// Draws the charts whose data the server put in each canvas's data-chart attribute.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const activity = document.getElementById("activity");
  if (activity) {
    const data = JSON.parse(activity.dataset.chart);
    new Chart(activity, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: [
          { label: "started", data: data.started, backgroundColor: "#3b82f6" },
          { label: "finished", data: data.finished, backgroundColor: "#22c55e" },
        ],
      },
      options: { animation: false, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }
  const timeline = document.getElementById("timeline");
  if (timeline) {
    const box = timeline.parentElement;
    box.style.height = `${box.dataset.height}px`; // set here: the page's policy allows no inline style
    const data = JSON.parse(timeline.dataset.chart);
    new Chart(timeline, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: [{ data: data.bars, backgroundColor: data.colours, borderSkipped: false }],
      },
      options: {
        indexAxis: "y",
        animation: false,
        maintainAspectRatio: false,
        plugins: {
          legend: { display: false },
          tooltip: {
            callbacks: {
              label: (item) => data.tips[item.dataIndex],
            },
          },
        },
        scales: {
          x: {
            ticks: { display: !data.folded },
            title: {
              display: true,
              text: data.folded
                ? "time since the saga started (long waits drawn short: their labels give their length)"
                : "ms since the saga started",
            },
          },
        },
      },
    });
  }
});
