from steps.report.step import main

raise SystemExit(main())
