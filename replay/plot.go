package replay

import (
	"fmt"
	"html"
	"io"
	"path/filepath"
	"strings"
)

// published are the FGD paper's figures (mean of seeds 42–51, allocation
// ratio in % at 100% arrived) for the openb traces, by the word that names
// the trace in its pod list's file name (the table of the trace's README).
var published = []struct {
	trace   string
	figures []publishedFigure
}{
	{"default", []publishedFigure{{"Random", 86.3}, {"DotProd", 90.6}, {"GpuClustering", 91.7}, {"GpuPacking", 91.8}, {"BestFit", 92.9}, {"FGD", 95.2}}},
	{"gpushare40", []publishedFigure{{"Random", 84.9}, {"DotProd", 89.3}, {"GpuClustering", 89.8}, {"GpuPacking", 89.8}, {"BestFit", 91.4}, {"FGD", 94.0}}},
	{"multigpu20", []publishedFigure{{"Random", 86.9}, {"DotProd", 91.8}, {"GpuClustering", 93.3}, {"GpuPacking", 93.5}, {"BestFit", 93.7}, {"FGD", 95.5}}},
	{"cpu050", []publishedFigure{{"Random", 89.0}, {"DotProd", 93.0}, {"GpuClustering", 93.5}, {"GpuPacking", 93.5}, {"BestFit", 93.6}, {"FGD", 95.0}}},
	{"cpu100", []publishedFigure{{"Random", 87.4}, {"DotProd", 91.7}, {"GpuClustering", 92.4}, {"GpuPacking", 92.5}, {"BestFit", 93.3}, {"FGD", 95.2}}},
	{"cpu200", []publishedFigure{{"Random", 83.0}, {"DotProd", 87.5}, {"GpuClustering", 89.7}, {"GpuPacking", 90.0}, {"BestFit", 92.2}, {"FGD", 94.8}}},
	{"gpushare60", []publishedFigure{{"Random", 82.8}, {"DotProd", 86.8}, {"GpuClustering", 86.9}, {"GpuPacking", 87.1}, {"BestFit", 89.1}, {"FGD", 91.3}}},
	{"gpushare80", []publishedFigure{{"Random", 80.6}, {"DotProd", 84.1}, {"GpuClustering", 84.5}, {"GpuPacking", 84.6}, {"BestFit", 86.7}, {"FGD", 89.1}}},
	{"gpuspec10", []publishedFigure{{"Random", 86.3}, {"DotProd", 90.2}, {"GpuClustering", 92.0}, {"GpuPacking", 92.2}, {"BestFit", 93.1}, {"FGD", 94.7}}},
	{"gpuspec20", []publishedFigure{{"Random", 85.9}, {"DotProd", 88.3}, {"GpuClustering", 89.1}, {"GpuPacking", 89.3}, {"BestFit", 88.5}, {"FGD", 94.7}}},
	{"multigpu30", []publishedFigure{{"Random", 86.6}, {"DotProd", 93.1}, {"GpuClustering", 94.6}, {"GpuPacking", 94.7}, {"BestFit", 94.6}, {"FGD", 96.4}}},
	{"multigpu40", []publishedFigure{{"Random", 85.4}, {"DotProd", 94.0}, {"GpuClustering", 95.3}, {"GpuPacking", 95.6}, {"BestFit", 95.1}, {"FGD", 96.9}}},
}

type publishedFigure struct {
	policy string
	at100  float64
}

// publishedFor is the published figures of the trace a pod list's file
// name names; none for another trace.
func publishedFor(pods string) (string, []publishedFigure) {
	base := filepath.Base(pods)
	for _, p := range published {
		if strings.Contains(base, p.trace) {
			return p.trace, p.figures
		}
	}
	return "", nil
}

// The plot's frame: arrived 60–130% across, allocated 60–100% up, where
// the policies part.
const (
	plotW, plotH               = 760, 480
	left, right, top, bottom   = 70, 200, 40, 50
	xMin, xMax, yMin, yMax     = 60.0, 130.0, 60.0, 100.0
	publishedColor, frameColor = "#888", "#333"
)

var curveColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

func px(x float64) float64 {
	return left + (x-xMin)/(xMax-xMin)*(plotW-left-right)
}

func py(y float64) float64 {
	y = max(min(y, yMax), yMin)
	return top + (yMax-y)/(yMax-yMin)*(plotH-top-bottom)
}

// writeSVG draws each policy's mean curve and the published figures at 100%
// arrived as dashed lines, by hand: a few lines and labels need no library.
func writeSVG(w io.Writer, results [][]Result, pods string) error {
	var b strings.Builder
	trace, figures := publishedFor(pods)
	title := "GPU allocated as the workload arrives: " + filepath.Base(pods)
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", plotW, plotH)
	fmt.Fprintf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"22\" font-size=\"14\">%s</text>\n", left, html.EscapeString(title))
	for x := xMin; x <= xMax; x += 10 {
		fmt.Fprintf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f%%</text>\n", px(x), top, px(x), plotH-bottom, px(x), plotH-bottom+16, x)
	}
	for y := yMin; y <= yMax; y += 5 {
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f%%</text>\n", left, py(y), plotW-right, py(y), left-6, py(y)+4, y)
	}
	fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"%s\"/>\n", left, top, plotW-left-right, plotH-top-bottom, frameColor)
	fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">workload arrived (%% of the cluster's GPU)</text>\n", px((xMin+xMax)/2), plotH-10)
	fmt.Fprintf(&b, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">GPU allocated (%%)</text>\n", py((yMin+yMax)/2))
	for _, f := range figures {
		if f.policy != "FGD" && f.policy != "BestFit" {
			continue
		}
		// The label sits inside the frame, left, above its line: the
		// right margin is the policies' legend.
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"5 4\"/><text x=\"%d\" y=\"%.1f\" fill=\"%s\">%s (paper) %.1f%% at 100%%</text>\n",
			left, py(f.at100), px(xMax), py(f.at100), publishedColor, left+6, py(f.at100)-4, publishedColor, f.policy, f.at100)
	}
	for i, per := range results {
		if len(per) == 0 {
			continue
		}
		s := summarize(per)
		color := curveColors[i%len(curveColors)]
		var pts []string
		for x := int(xMin); x <= MaxArrived; x++ {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(x)), py(s.alloc[x])))
		}
		fmt.Fprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", color, strings.Join(pts, " "))
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s %.2f%% at 100%%</text>\n", plotW-right+6, top+14+16*i, color, per[0].Policy, s.alloc[100])
	}
	if trace != "" {
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" fill=\"%s\">dashed: the FGD paper's</text><text x=\"%d\" y=\"%d\" fill=\"%s\">figures (%s)</text>\n", plotW-right+6, plotH-bottom-16, publishedColor, plotW-right+6, plotH-bottom, publishedColor, trace)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
