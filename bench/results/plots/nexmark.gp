set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Nexmark: events/s per core, sluice by checkpoint interval, and Flink'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel 'M events/s per core (log)'
set yrange [0.01:*]
set key top right
plot 'nexmark.dat' using 2:xtic(1) title 'off', 'nexmark.dat' using 3:xtic(1) title 'every 1000 ms', 'nexmark.dat' using 4:xtic(1) title 'every 100 ms', 'nexmark.dat' using 5:xtic(1) title 'every 10 ms', 'nexmark.dat' using 6:xtic(1) title 'Flink (published)'
